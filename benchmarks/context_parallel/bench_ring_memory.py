"""Peak memory per rank at sequence 16384: one rank against ring context parallelism over 4
CPU ranks (parallel.context_parallel_algo=ring, CP4), the same model, sample and step. The
number is the trainer's own mem_gb (the rank process's peak resident set, metrics.jsonl, rank
0), so it counts everything a rank holds: interpreter, torch, DeepSpeed, weights, optimizer
state and activations. Ring attention runs its explicit backward here (no attention dropout:
model/context_attention.py), which keeps q, k, v, the output and the log-sum-exp per layer.

    .venv/bin/python benchmarks/context_parallel/bench_ring_memory.py   # writes benchmarks/results/

The model of bench_memory.py with 8 layers (activations dominate at this length): hidden 128,
4 heads, MLP 4096, SDPA attention on the one rank (O(s) memory on the CPU), the ring's blocks
by the math path, fp32, ZeRO-0, micro-batch 1, one step. The goal (issue: ring attention) is
at most 0.35x of one rank's peak; 0.25x is the activations' own share."""
from __future__ import annotations

import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_memory  # noqa: E402
from bench_memory import MODEL, OUT  # noqa: E402

SEQ = 16384
RING = [s for s in MODEL if not s.startswith(("model.seq_length", "model.max_position",
                                              "model.num_layers", "training.train_iters"))]
RING += [f"model.seq_length={SEQ}", f"model.max_position_embeddings={SEQ}",
         "model.num_layers=8", "training.train_iters=1"]


def run(cp: int, tmp: str) -> dict:
    extra = ["parallel.context_parallel_algo=ring"] if cp > 1 else []
    return bench_memory.run(cp, tmp, RING + extra)  # one step: its median is that step


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        one, ring = run(1, tmp), run(4, tmp)
    ratio = ring["peak_gb"] / one["peak_gb"]
    result = {"seq_length": SEQ, "settings": RING, "one_rank": one, "ring_cp4": ring,
              "peak_ratio": ratio, "goal": 0.35, "machine": f"{os.cpu_count()}-core CPU, gloo"}
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "ring_attention_memory.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(OUT, "ring_attention_memory.md"), "w") as f:
        f.write(f"# Ring attention memory at sequence {SEQ}\n\n"
                "`benchmarks/context_parallel/bench_ring_memory.py`; peak resident set per rank "
                "(the trainer's `mem_gb`), 8 layers, hidden 128, MLP 4096, fp32, micro-batch 1, "
                f"one step, {result['machine']}.\n\n"
                "| layout | peak per rank (GiB) | step (s) | loss |\n|---|---|---|---|\n"
                f"| one rank (SDPA) | {one['peak_gb']:.3f} | {one['step_s']:.1f} | "
                f"{one['losses'][0]:.5f} |\n"
                f"| ring CP4 (4 ranks) | {ring['peak_gb']:.3f} | {ring['step_s']:.1f} | "
                f"{ring['losses'][0]:.5f} |\n\n"
                f"ring CP4 / one rank: **{ratio:.2f}x** (goal <= 0.35x)\n")
    print(f"one rank {one['peak_gb']:.3f} GiB, ring CP4 {ring['peak_gb']:.3f} GiB per rank: "
          f"{ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
