"""Peak memory per rank at sequence 8192: one rank against context parallel 2 (Ulysses) on 2 CPU
ranks, the same model, samples and steps. The number is the trainer's own mem_gb (the rank
process's peak resident set, metrics.jsonl, rank 0), so it counts everything a rank holds:
interpreter, torch, DeepSpeed, weights, optimizer state and activations.

    .venv/bin/python benchmarks/context_parallel/bench_memory.py   # writes benchmarks/results/

A model whose activations dominate, as long sequences make them, at a cost this 2-core machine
can pay: 12 layers of hidden 128 with a wide MLP (4096; about 13M parameters), so activations
are ~3.7 GB against a fixed ~0.5 GB of interpreter, torch and DeepSpeed; SDPA attention (O(s)
memory on the CPU), fp32, ZeRO-0, micro-batch 1, 2 steps."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "examples", "local", "tiny.yaml")
OUT = os.path.join(ROOT, "benchmarks", "results")
sys.path.insert(0, ROOT)
from megatron.base.records import StepRecord, read_metrics  # noqa: E402
from megatron.base.rundir import RunDir  # noqa: E402

SEQ = 8192
MODEL = [f"model.seq_length={SEQ}", f"model.max_position_embeddings={SEQ}",
         "model.num_layers=12", "model.hidden_size=128", "model.num_attention_heads=4",
         "model.ffn_hidden_size=4096",
         "model.attention_backend=sdpa", "model.hidden_dropout=0.0",
         "model.attention_dropout=0.0", "training.micro_batch_size=1",
         "training.global_batch_size=1", "training.train_iters=2", "training.tensorboard=false",
         "training.precision=fp32", "parallel.zero_stage=0", "data.synthetic=true"]


def train_steps(sets, cp: int, run_dir: str):
    """megatron-train on tiny.yaml with `sets` at context-parallel degree `cp` (one process, or
    torchrun with cp ranks, which binds its own rendezvous port); the step records rank 0
    wrote."""
    sets = list(sets) + [f"parallel.context_parallel_size={cp}", f"run.dir={run_dir}"]
    args = ["--config", TINY] + [a for s in sets for a in ("--set", s)]
    train = [sys.executable, "-m", "megatron.cli.train"]
    cmd = train + args if cp == 1 else [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={cp}",
        "--standalone", "-m", "megatron.cli.train"] + args
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    return [r for r in read_metrics(RunDir(run_dir).metrics) if isinstance(r, StepRecord)]


def run(cp: int, tmp: str, sets=MODEL) -> dict:
    """Peak memory per rank, losses and the median step of `sets` at context-parallel degree
    cp (bench_ring_memory.py passes its own settings)."""
    steps = train_steps(sets, cp, os.path.join(tmp, f"cp{cp}"))
    return {"ranks": cp, "peak_gb": max(r.mem_gb for r in steps),
            "losses": [r.loss for r in steps],
            "step_s": sorted(r.step_time_s for r in steps)[len(steps) // 2]}


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        one, two = run(1, tmp), run(2, tmp)
    ratio = two["peak_gb"] / one["peak_gb"]
    result = {"seq_length": SEQ, "settings": MODEL, "one_rank": one, "cp2": two,
              "peak_ratio": ratio, "machine": f"{os.cpu_count()}-core CPU, gloo"}
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "context_parallel_memory.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(OUT, "context_parallel_memory.md"), "w") as f:
        f.write(f"# Context parallel (Ulysses) memory at sequence {SEQ}\n\n"
                "`benchmarks/context_parallel/bench_memory.py`; peak resident set per rank "
                "(the trainer's `mem_gb`), 12 layers, hidden 128, MLP 4096, fp32, micro-batch 1, "
                f"{result['machine']}.\n\n"
                "| layout | peak per rank (GiB) | median step (s) | losses |\n|---|---|---|---|\n"
                f"| one rank | {one['peak_gb']:.3f} | {one['step_s']:.2f} | "
                f"{', '.join(f'{x:.5f}' for x in one['losses'])} |\n"
                f"| CP2 (2 ranks) | {two['peak_gb']:.3f} | {two['step_s']:.2f} | "
                f"{', '.join(f'{x:.5f}' for x in two['losses'])} |\n\n"
                f"CP2 / one rank: **{ratio:.2f}x**\n")
    print(f"one rank {one['peak_gb']:.3f} GiB, CP2 {two['peak_gb']:.3f} GiB per rank: "
          f"{ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
