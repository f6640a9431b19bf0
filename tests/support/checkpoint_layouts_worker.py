"""Worker for the cross-layout continuation tests, run under torchrun (or alone for 1 rank).

--sources: layouts trained 10 steps uninterrupted, saving at step 5 (their steps 6-10 are the
"continued in X" reference). --targets SRC>DST: step 5 of SRC's run copied into a new run
directory and continued to step 10 in layout DST. Rank 0 writes {case: losses of steps 6-10,
case/norms: {norms: their gradient norms, clip: the clipping threshold}} as JSON.

    torchrun --nproc_per_node 4 checkpoint_layouts_worker.py --workdir W --out r.json \\
        --sources pp2dp2_zero1 --targets tp1>tp2pp2
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys

import torch.distributed as dist

from megatron.base.records import read_metrics, steps
from megatron.base.rundir import RunDir
from megatron.config import load_config
from megatron.training.loop import train

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from worker_exit import exit_after  # noqa: E402
from run_layouts import COMMON, FLAVOURS, TINY  # noqa: E402

LAYOUTS = {
    "tp1": [],
    "tp2": ["parallel.tensor_parallel_size=2"],
    "tp2pp2": ["parallel.tensor_parallel_size=2", "parallel.pipeline_parallel_size=2"],
    "pp2dp2_zero1": ["parallel.pipeline_parallel_size=2", "parallel.zero_stage=1"],
    "tp2dp2_zero3": ["parallel.tensor_parallel_size=2", "parallel.zero_stage=3"],
    "dp2_zero2": ["parallel.zero_stage=2"],
    "dp4_zero1": ["parallel.zero_stage=1"],
    "dp2_zero1_bf16": ["parallel.zero_stage=1", "training.precision=bf16"],
    # fp32 gradient accumulation: DeepSpeed's BF16_Optimizer at ZeRO-1 (its own flat partitions)
    "dp2_zero1_bf16acc": ["parallel.zero_stage=1", "training.precision=bf16",
                          "training.grad_accum_dtype=fp32"],
    "tp2_zero0_bf16": ["parallel.tensor_parallel_size=2", "parallel.zero_stage=0",
                       "training.precision=bf16"],
    # interleaved 1F1B: rank r holds model chunks r and r + 2 (layers r and r + 2 of 4)
    "pp2v2": ["parallel.pipeline_parallel_size=2", "parallel.pipeline_schedule=interleaved",
              "parallel.virtual_pipeline_size=2"],
    # ZB-V: rank 0 holds layers 0 and 3 (and the tied embedding twice), rank 1 layers 1 and 2
    "pp2zbv": ["parallel.pipeline_parallel_size=2", "parallel.pipeline_schedule=zbv",
               "parallel.virtual_pipeline_size=2"],
    "pp2": ["parallel.pipeline_parallel_size=2"],
    "pp4": ["parallel.pipeline_parallel_size=4"],
    # uneven stages: layer 0 on the first stage (with the embedding), layers 1-3 on the last
    "pp2_first1": ["parallel.pipeline_parallel_size=2", "parallel.pipeline_first_stage_layers=1"],
}


EXTRA: list = []  # --set: overrides for every run of this launch (training.async_save=true)


def overrides(layout: str, flavour: str, run_dir: str):
    return COMMON + FLAVOURS[flavour] + LAYOUTS[layout] + [f"run.dir={run_dir}",
                                                           "training.tensorboard=false"] + EXTRA


def run_dir(workdir, *parts):
    return os.path.join(workdir, "-".join(parts))


def norms(cfg, summary, wanted):
    """The gradient norms of the steps `wanted` (1-based) from the run's metrics.jsonl, and the
    clipping threshold: what tests/support/exactness.py needs to tell a norm's last bit from an
    error."""
    records = steps(read_metrics(RunDir(summary.run_dir).metrics))
    by_step = {r.step: r.grad_norm for r in records}
    return {"norms": [by_step[s] for s in wanted], "clip": cfg.training.clip_grad}


def source(workdir, layout, flavour):
    cfg = load_config(TINY, overrides(layout, flavour, run_dir(workdir, layout, flavour))
                      + ["training.save_interval=5"])
    summary = train(cfg)
    return summary.losses[5:], norms(cfg, summary, range(6, 11))


def target(workdir, src, dst, flavour):
    new = run_dir(workdir, src, "to", dst, flavour)
    if _rank0():
        shutil.copytree(os.path.join(run_dir(workdir, src, flavour), "checkpoints",
                                     "step_0000005"),
                        os.path.join(new, "checkpoints", "step_0000005"))
    if dist.is_initialized():
        dist.barrier()
    cfg = load_config(TINY, overrides(dst, flavour, new) + ["training.load=auto"])
    summary = train(cfg)
    assert summary.steps == 10 and len(summary.losses) == 5, (summary.steps, summary.losses)
    return summary.losses, norms(cfg, summary, range(6, 11))


def _rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--sources", default="", help="comma-separated LAYOUT[:flavour]")
    p.add_argument("--targets", default="", help="comma-separated SRC>DST[:flavour]")
    p.add_argument("--flavours", default="gpt2,llama")
    p.add_argument("--set", action="append", default=[], dest="extra",
                   help="section.key=value for every run (repeatable)")
    args = p.parse_args()
    EXTRA.extend(args.extra)
    logging.basicConfig(level=logging.WARNING)
    results = {}
    for case in filter(None, args.sources.split(",")):
        layout, _, only = case.partition(":")
        for flavour in ([only] if only else args.flavours.split(",")):
            key = f"{layout}/{flavour}"
            results[key], results[f"{key}/norms"] = source(args.workdir, layout, flavour)
    for case in filter(None, args.targets.split(",")):
        pair, _, only = case.partition(":")
        src, dst = pair.split(">")
        for flavour in ([only] if only else args.flavours.split(",")):
            key = f"{src}>{dst}/{flavour}"
            results[key], results[f"{key}/norms"] = target(args.workdir, src, dst, flavour)
    if _rank0():
        with open(args.out, "w") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    exit_after(main)
