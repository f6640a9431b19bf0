"""ZB-H1 against 1F1B on this machine: PP2 on 2 CPU ranks (gloo), a model whose passes take
milliseconds, m = 4 and m = 16 micro-batches per step. Both engines are built in one launch and
their steps alternate (a barrier before each), so machine load shared with other work falls on
both alike; min and median of each are reported, and the ratio of medians. Also the ratio the
schedule's own replay (engine/pipe_order.makespan) predicts with F = B = W.

    .venv/bin/python benchmarks/pipeline/bench_zero_bubble.py   # writes benchmarks/results/"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from megatron.engine import pipe_order  # noqa: E402

WORKER = os.path.join(ROOT, "tests", "support", "zero_bubble_worker.py")
OUT = os.path.join(ROOT, "benchmarks", "results")


def run(m: int, rounds: int, steps: int):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
               "--standalone", WORKER, "--out", out, "--cases", "bench-gpt2",
               "--workdir", tmp, "--alternate", str(rounds), "--steps", str(steps),
               "--set", f"training.global_batch_size={2 * m}"]
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
        with open(out) as f:
            return json.load(f)["bench-gpt2"]


def main() -> int:
    rows = []
    for m in (4, 16):
        times = run(m, rounds=6, steps=2)
        t = {s: sorted(v[1:]) for s, v in times.items()}  # the first step warms up
        med = {s: statistics.median(v) for s, v in t.items()}
        unit = [{"F": 1.0, "B": 1.0, "W": 1.0}] * 2
        predicted = (pipe_order.makespan("zbh1", 2, m, unit)
                     / pipe_order.makespan("1f1b", 2, m, [{"F": 1.0, "B": 2.0}] * 2))
        rows.append({"pp": 2, "m": m, "min_1f1b_s": t["1f1b"][0], "min_zbh1_s": t["zbh1"][0],
                     "median_1f1b_s": med["1f1b"], "median_zbh1_s": med["zbh1"],
                     "ratio_median": med["zbh1"] / med["1f1b"],
                     "ratio_min": t["zbh1"][0] / t["1f1b"][0],
                     "predicted_ratio_f_eq_b_eq_w": predicted, "steps_each": len(t["1f1b"])})
    with open(os.path.join(OUT, "pipeline_zero_bubble.json"), "w") as f:
        json.dump(rows, f, indent=1)
    lines = ["# ZB-H1 vs 1F1B, PP2 on 2 CPU ranks (gloo)", "",
             "benchmarks/pipeline/bench_zero_bubble.py: GPT-2 flavour, 4 layers, hidden 256, "
             "seq 128, micro-batch 2, fp32, ZeRO-0; steps alternated in one launch.", "",
             "| m | 1F1B median s | ZB-H1 median s | ratio (median) | ratio (min) | "
             "replay, F = B = W |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['m']} | {r['median_1f1b_s']:.3f} | {r['median_zbh1_s']:.3f} | "
                     f"{r['ratio_median']:.3f} | {r['ratio_min']:.3f} | "
                     f"{r['predicted_ratio_f_eq_b_eq_w']:.3f} |")
    with open(os.path.join(OUT, "pipeline_zero_bubble.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
