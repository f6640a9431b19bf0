#!/usr/bin/env python3
"""What the loop's guards against the machine cost per step (issue 20: at most 1%), measured
directly rather than as a difference of two noisy whole-trainer runs:

- the hang watchdog's bookkeeping: the loop's enter()/done() calls of one step (step,
  agreement, rollback, save; evaluation only at its interval), with the process groups'
  timeout callback attached, in steady state;
- the watchdog thread itself: the same compute-bound work (float32 GEMMs on one thread) per CPU
  second of the process, with the thread waking every POLL_S seconds and without it, alternated;
- the straggler check: one all-gather of a float over two gloo ranks, paid every
  resilience.straggler_interval (50) steps.

    python benchmarks/trainer/bench_guards.py [--out benchmarks/results] [--rounds 5]

Writes DIR/guards_cost.json and DIR/guards_cost.md; per-step costs are given against a step of
the trainer benchmark's single model on this machine (~1 s) and against a 10 ms step (a small
model on a fast GPU: the worst case)."""
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

from megatron.base.rundir import RunDir  # noqa: E402
from megatron.training.watchdog import Watchdog  # noqa: E402

PHASES = ("step", "agreement", "rollback", "save")


def bookkeeping_us(steps: int = 200_000) -> float:
    """Microseconds of the watchdog calls of one steady-state step."""
    dog = Watchdog(RunDir(tempfile.mkdtemp()), 0, startup_s=1800, floor_s=300)
    dog.join(["n0"], time.time(), lambda seconds: None, base_s=600)
    for phase in PHASES:  # measured once each: from here on the steady limit
        dog.enter(phase, 1)
        dog.done()
    t0 = time.perf_counter()
    for step in range(steps):
        dog.enter("step", step)
        dog.done()
        for phase in PHASES[1:]:
            dog.enter(phase)
            dog.done()
    return (time.perf_counter() - t0) / steps * 1e6


def _gemms(seconds: float) -> float:
    """GEMMs of 256x256 float32 matrices on this thread per second of the process's CPU time
    (every thread's, the watchdog's among them) over `seconds` of it: other work on the machine
    delays the loop but does not count."""
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    n, t0 = 0, time.process_time()
    while time.process_time() - t0 < seconds:
        for _ in range(50):
            torch.mm(a, b)
        n += 50
    return n / (time.process_time() - t0)


def thread_ratio(rounds: int, seconds: float = 3.0):
    """(median, min, max) of GEMM rate with the watchdog thread over without it, per round."""
    ratios = []
    for _ in range(rounds):
        without = _gemms(seconds)
        with Watchdog(RunDir(tempfile.mkdtemp()), 0, startup_s=1800, floor_s=300) as dog:
            dog.enter("step", 1)
            watched = _gemms(seconds)
        ratios.append(watched / without)
    return statistics.median(ratios), min(ratios), max(ratios)


def _gather_worker(rank: int, port: int, queue) -> None:
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mine = torch.tensor([1.0])
    every = [torch.zeros(1) for _ in range(2)]
    for _ in range(20):
        dist.all_gather(every, mine)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(500):
        dist.all_gather(every, mine)
    if rank == 0:
        queue.put((time.perf_counter() - t0) / 500 * 1e6)
    dist.destroy_process_group()


def gather_us() -> float:
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_gather_worker, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    value = queue.get(timeout=120)
    for p in procs:
        p.join(60)
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join("benchmarks", "results"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    book = statistics.median(bookkeeping_us() for _ in range(3))
    gather = gather_us()
    thread = thread_ratio(args.rounds)
    per_step_us = book + gather / 50
    result = {"bookkeeping_us_per_step": round(book, 2), "straggler_gather_us": round(gather, 1),
              "straggler_interval": 50, "guards_us_per_step": round(per_step_us, 2),
              "share_of_1s_step": per_step_us / 1e6, "share_of_10ms_step": per_step_us / 1e4,
              "thread_gemm_ratio": {"median": round(thread[0], 4), "min": round(thread[1], 4),
                                    "max": round(thread[2], 4)}, "rounds": args.rounds}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "guards_cost.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(args.out, "guards_cost.md"), "w") as f:
        f.write(_table(result))
    print(_table(result))
    return 0


def _table(r) -> str:
    t = r["thread_gemm_ratio"]
    return (
        "# What the guards against the machine cost per step\n\n"
        "`benchmarks/trainer/bench_guards.py` (development CPU: 2 cores, no GPU, one thread)\n\n"
        "| cost | measured |\n|---|---|\n"
        f"| watchdog bookkeeping of one step (4 phases, timeout callback attached) | "
        f"{r['bookkeeping_us_per_step']} µs |\n"
        f"| straggler all-gather (2 gloo ranks), every {r['straggler_interval']} steps | "
        f"{r['straggler_gather_us']} µs |\n"
        f"| together, per step | {r['guards_us_per_step']} µs: "
        f"{100 * r['share_of_1s_step']:.4f}% of a 1 s step, "
        f"{100 * r['share_of_10ms_step']:.3f}% of a 10 ms step |\n"
        f"| GEMMs per CPU second with the watchdog thread / without, {r['rounds']} "
        f"alternated rounds | "
        f"{t['median']} ({t['min']}-{t['max']}) |\n")


if __name__ == "__main__":
    sys.exit(main())
