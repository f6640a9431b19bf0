#!/usr/bin/env python3
"""What resilience.check_state costs per step (issue 40: at most 1% on CPU), measured inside the
trainer rather than as a difference of two noisy whole runs: the overhead benchmark's model
(facts.ISSUE: GPT-2-like, 5.3M parameters, fp32, ZeRO-0, one thread) trains in this process
with the check on, every call of the check is timed, and its median is set against the median
step (the step includes it). On one rank the check is the moment bound over the whole AdamW
state and no checksum; with data parallelism each rank checks its own state (its shard under
ZeRO 1-3), adds the checksum of its weights (one norm pass) and one all-gather of three
floats, whose latency is the straggler check's (bench_guards.gather_us, two gloo ranks).

    python benchmarks/trainer/bench_state_check.py [--out benchmarks/results] [--steps 12]

Writes DIR/state_check_cost.json and DIR/state_check_cost.md."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_guards import gather_us  # noqa: E402
from facts import ISSUE, megatron_overrides  # noqa: E402
from megatron.config import load_config  # noqa: E402
from megatron.training import state_check  # noqa: E402
from megatron.training.loop import train  # noqa: E402


def measure(steps: int):
    """(median check seconds, median step seconds, checksum seconds) over `steps` steps."""
    timed, sums = [], []
    verify, checksum = state_check.StateCheck.verify, state_check.checksum

    def timed_verify(self, step):
        t0 = time.perf_counter()
        ok = verify(self, step)
        timed.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        checksum(self.params)  # what a data-parallel rank adds (not compared on one rank)
        sums.append(time.perf_counter() - t0)
        return ok

    state_check.StateCheck.verify = timed_verify
    try:
        config = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "local",
                              "tiny.yaml")
        summary = train(load_config(config, megatron_overrides(ISSUE, steps, tempfile.mkdtemp())))
    finally:
        state_check.StateCheck.verify = verify
    warm = slice(2, None)  # the first steps include allocations and dynamo's first call
    return (statistics.median(timed[warm]), statistics.median(summary.timing.step_s[warm]),
            statistics.median(sums[warm]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join("benchmarks", "results"))
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(1)
    check_s, step_s, sum_s = measure(args.steps)
    gather = gather_us() / 1e6
    dp_s = check_s + sum_s + gather
    result = {"shape": ISSUE.as_dict(), "steps": args.steps,
              "check_ms_one_rank": round(1e3 * check_s, 3), "step_ms": round(1e3 * step_s, 1),
              "checksum_ms": round(1e3 * sum_s, 3), "gather_ms_two_gloo_ranks": round(1e3 * gather, 3),
              "share_one_rank": check_s / (step_s - check_s),
              "share_data_parallel": dp_s / (step_s - check_s)}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "state_check_cost.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(args.out, "state_check_cost.md"), "w") as f:
        f.write(_table(result))
    print(_table(result))
    return 0


def _table(r) -> str:
    s = r["shape"]
    return (
        "# What the training state's invariants cost per step\n\n"
        "`benchmarks/trainer/bench_state_check.py` (development CPU: 2 cores, no GPU, one thread; "
        f"{s['layers']} layers, hidden {s['hidden']}, seq {s['seq']}, batch {s['batch']}, fp32, "
        f"ZeRO-0, medians of {r['steps'] - 2} steps)\n\n"
        "| cost | measured |\n|---|---|\n"
        f"| a step (the check included) | {r['step_ms']} ms |\n"
        f"| the moment bound over the whole AdamW state | {r['check_ms_one_rank']} ms: "
        f"{100 * r['share_one_rank']:.2f}% of the step without it |\n"
        f"| with data parallelism: + the weights' checksum | {r['checksum_ms']} ms |\n"
        f"| + one all-gather of 3 floats (2 gloo ranks) | {r['gather_ms_two_gloo_ranks']} ms |\n"
        f"| together, a data-parallel rank (ZeRO-0: the whole state) | "
        f"{100 * r['share_data_parallel']:.2f}% of the step |\n")


if __name__ == "__main__":
    sys.exit(main())
