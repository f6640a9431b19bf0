#!/usr/bin/env python3
"""The host's share of a step: the end-to-end benchmark's runs on a shape with the 1.3B GPT's
parameter tensors (24 layers, 292 tensors) and almost no arithmetic (hidden 64, sequence 32, one
sequence a step), on the CPU, so a step's time is the Python and launch work around the
operators: the trainer's forward, backward and DeepSpeed's update against the plain PyTorch
peer's. On a GPU that work overlaps the device's only until the first synchronisation of the
update (benchmarks/results/gpu_h200.md).

    python benchmarks/e2e/bench_host.py [--rounds 3] [--runs peer,torch,torch_zero0,torch_bf16opt]

Each round runs every program once, in turn (each in a process of its own, one thread), and
compares it with the peer of the same round; the table gives the medians over rounds and the
ratio's range. Results: host_overhead_cpu.{json,md} in --out."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_e2e import ROOT, Shape, device_facts, run_megatron, run_peer  # noqa: E402
from e2e_report import LABELS  # noqa: E402

HOST_SHAPE = Shape(24, 64, 4, 32, 512, micro_batch=1, global_batch=1)
RUNS = ("peer", "torch", "torch_zero0", "torch_bf16opt")


def one_round(runs, iters: int, warmup: int, work: Path, timeout: float) -> dict:
    times = {}
    for name in runs:
        raw = run_peer(HOST_SHAPE, iters, "cpu", work, timeout) if name == "peer" else \
            run_megatron(HOST_SHAPE, name, iters, work, timeout)
        if raw.get("error"):
            raise SystemExit(f"bench_host: {name} failed: {raw['error']}")
        times[name] = statistics.median(raw["step_times"][warmup:]) * 1e3
    return times


def report(rounds: list, runs) -> str:
    sh = HOST_SHAPE
    lines = [f"# Host time a step: the 1.3B GPT's parameter tensors at hidden {sh.hidden}", "",
             f"{sh.layers} layers, hidden {sh.hidden}, {sh.heads} heads, sequence {sh.seq}, "
             f"vocabulary {sh.vocab}, {sh.global_batch} sequence(s) a step, bf16, one CPU "
             f"thread; {len(rounds)} rounds, each program once a round in its own process; the "
             "median step of each run, then the median over rounds.", "",
             "| run | ms a step | x peer (median, range over rounds) |", "|---|---|---|"]
    for name in runs:
        ms = statistics.median(r[name] for r in rounds)
        ratios = [r[name] / r["peer"] for r in rounds]
        lines.append(f"| {LABELS.get(name, name)} | {ms:.1f} | "
                     f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, among {RUNS}; "
                   "the peer always runs (the ratios' denominator)")
    p.add_argument("--steps", type=int, default=20, help="timed steps a run (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="steps left out (default 5)")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = p.parse_args(argv)
    runs = ["peer"] + [r for r in args.runs.split(",") if r and r != "peer"]
    unknown = sorted(set(runs) - set(RUNS))
    if unknown:
        print(f"bench_host: unknown run(s) {unknown}; choose among {', '.join(RUNS)}",
              file=sys.stderr)
        return 2
    os.environ.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench_host_") as work:
        for i in range(args.rounds):
            rounds.append(one_round(runs, args.warmup + args.steps, args.warmup, Path(work),
                                    args.timeout))
            print(f"bench_host: round {i + 1}: " + ", ".join(
                f"{k} {v:.1f} ms" for k, v in rounds[-1].items()), flush=True)
    text = report(rounds, runs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "host_overhead_cpu.md").write_text(text)
    (out / "host_overhead_cpu.json").write_text(json.dumps(
        {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
         "device": device_facts(argparse.Namespace(cpu=True, peak_tflops=None)),
         "shape": asdict(HOST_SHAPE), "rounds_ms": rounds},
        indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
