#!/usr/bin/env python3
"""What counting labels costs the loss (data.eod_mask_loss; model/gpt.counted_mean): the
language-model loss's forward and backward as the model runs it now, the mean over the counted
labels with labels of an end-of-document every ~500 tokens, against the plain mean it replaced
(`token_losses(...).mean()`), on the same logits, alternated in one process, one thread.

    python benchmarks/trainer/bench_loss_mask.py [--out benchmarks/results] [--rounds 7]

Writes DIR/loss_mask_cpu.json and DIR/loss_mask_cpu.md: the median of each round's median
over its calls, per shape, and the ratio of the two."""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from megatron.model.gpt import lm_loss, local_labels  # noqa: E402
from megatron.model.loss import token_losses  # noqa: E402
from megatron.parallel.state import ParallelState  # noqa: E402

# (sequence, micro-batch, vocabulary): a GPT-2-sized head's row of 2048 tokens, a small model's
SHAPES = [(2048, 1, 50304), (1024, 2, 8192), (256, 8, 512)]
ONE = ParallelState.single()


def _case(seq: int, mb: int, vocab: int):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(seq, mb, vocab, generator=g).requires_grad_()
    labels = torch.randint(0, vocab, (mb, seq), generator=g)
    labels[:, ::500] = -1  # the labels an end-of-document input leaves uncounted
    return logits, labels


def _plain(logits, labels):
    return token_losses(logits, local_labels(labels, ONE).clamp(min=0), ONE).mean()


def _counted(logits, labels):
    return lm_loss(logits, labels, ONE)


def _median_ms(fn, logits, labels, calls: int) -> float:
    times = []
    for _ in range(calls):
        logits.grad = None
        start = time.perf_counter()
        fn(logits, labels).backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "results"))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=9)
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    for seq, mb, vocab in SHAPES:
        logits, labels = _case(seq, mb, vocab)
        runs = {"plain": [], "counted": []}
        for _ in range(args.rounds):
            for name, fn in (("plain", _plain), ("counted", _counted)):
                runs[name].append(_median_ms(fn, logits, labels, args.calls))
        plain, counted = (statistics.median(runs[k]) for k in ("plain", "counted"))
        rows.append({"seq": seq, "micro_batch": mb, "vocab": vocab, "plain_ms": plain,
                     "counted_ms": counted, "ratio": counted / plain,
                     "rounds": runs})
        print(f"s {seq} b {mb} V {vocab}: plain {plain:.2f} ms, counted {counted:.2f} ms, "
              f"x{counted / plain:.3f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "loss_mask_cpu.json"), "w") as f:
        json.dump({"machine": platform.processor() or platform.machine(), "threads": 1,
                   "rows": rows}, f, indent=1)
    lines = ["# The loss over counted labels against the plain mean (CPU, one thread)", "",
             "`benchmarks/trainer/bench_loss_mask.py`: forward and backward of the language-model "
             "loss on the same fp32 logits, one label in 500 ignored, alternated in one process; "
             f"the median of {args.rounds} rounds of each round's median over {args.calls} calls.",
             "", "| sequence | micro-batch | vocabulary | plain mean (ms) | counted mean (ms) | "
             "ratio |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['seq']} | {r['micro_batch']} | {r['vocab']} | {r['plain_ms']:.2f} | "
              f"{r['counted_ms']:.2f} | {r['ratio']:.3f} |" for r in rows]
    with open(os.path.join(args.out, "loss_mask_cpu.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
