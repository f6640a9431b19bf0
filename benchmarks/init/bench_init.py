"""Start-up cost of weight initialisation for one transformer layer at scale, per rank.

Compares, for the four TP-sharded matrices of one layer (QKV, projection, fc1, fc2; GPT
flavour, hidden size --hidden):
- whole: one generator draws the full tensor, the rank keeps its slice (the scheme before the
  per-line seeds; every rank pays for the whole tensor);
- lines: sharded_normal, each rank draws only its own lines (what the layers do now).
Prints seconds and peak extra memory per scheme for TP 1 and --tp, and writes a Markdown table.

    python benchmarks/init/bench_init.py --hidden 8192 --tp 8 --out benchmarks/results
"""
from __future__ import annotations

import argparse
import platform
import resource
import time
from pathlib import Path

import torch

from megatron.parallel.layers import shard, sharded_normal


def whole(shape, dim, rank, size):
    g = torch.Generator().manual_seed(1)
    full = torch.empty(shape).normal_(0.0, 0.02, generator=g)
    return shard(full, dim, rank, size)


def lines(shape, dim, rank, size):
    return sharded_normal(shape, 0.02, 1, dim, rank, size)


def layer_shapes(h):
    return [((3 * h, h), 0), ((h, h), 1), ((4 * h, h), 0), ((h, 4 * h), 1)]


def run(scheme, h, tp):
    begin = time.perf_counter()
    numel = sum(scheme(shape, dim, 0, tp).numel() for shape, dim in layer_shapes(h))
    return time.perf_counter() - begin, numel


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (a Frontier rank "
                   "has 7 cores; 1 is the conservative case)")
    p.add_argument("--out", default=None, help="folder for init.md")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    rows = []
    for tp in (1, a.tp):
        for name, scheme in (("whole", whole), ("lines", lines)):
            seconds, numel = run(scheme, a.hidden, tp)
            rows.append((tp, name, seconds, numel))
            print(f"TP{tp} {name:5s} {seconds:7.2f} s for {numel / 1e6:.0f}M parameters kept")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    base = {tp: s for tp, n, s, _ in rows if n == "whole"}
    table = ["| TP | scheme | seconds per layer (rank 0) | vs whole |", "|---|---|---|---|"]
    table += [f"| {tp} | {n} | {s:.2f} | {s / base[tp]:.2f}x |" for tp, n, s, _ in rows]
    text = (f"# Weight initialisation per rank, one GPT layer at hidden {a.hidden}\n\n"
            f"Machine: {platform.processor() or platform.machine()}, {a.threads} torch "
            f"thread(s); peak RSS of the process {peak:.1f} GiB.\n\n" + "\n".join(table) + "\n")
    print(text)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "init.md").write_text(text)


if __name__ == "__main__":
    main()
