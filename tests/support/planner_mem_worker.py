"""Worker for test_planner_measured_peak.py: under torchrun, trains each requested layout for a
few steps in this one process and measures how much resident memory the run adds on top of
what the process already held (interpreter, torch, DeepSpeed, the process group).

Per layout: collect garbage, read VmRSS (the baseline), reset the peak (writing "5" to
/proc/self/clear_refs resets VmHWM on Linux), train, read VmHWM. The delta is what the model's
tensors, the optimizer and the activations took at their peak. Each rank writes its figures to
<out>/rank<R>.json. Run with MALLOC_MMAP_THRESHOLD_ set (the test does) so that glibc serves
large tensors with mmap and returns them on free: otherwise one layout's freed heap is reused
by the next and the delta under-counts.

    torchrun --nproc_per_node 2 tests/support/planner_mem_worker.py --out DIR --layouts tp2,pp2
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import re
import sys
import time

from megatron.config import load_config, schedules
from megatron.planner.layout import Job, Layout
from megatron.planner.memory import GIB, memory_per_stage
from megatron.planner.profile import Constants
from megatron.training.loop import train

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, when run by path
from worker_exit import exit_after  # noqa: E402
from paths import TINY  # noqa: E402

# ~29.5M parameters (8 x 3.15M per layer + a 8192 x 512 tied embedding + 256 x 512 positions):
# fp32 weights, gradients and Adam states are hundreds of MB, well above allocator noise.
MODEL = ["model.num_layers=8", "model.hidden_size=512", "model.num_attention_heads=8",
         "model.seq_length=128", "model.vocab_size=8192", "model.attention_backend=sdpa",
         "model.hidden_dropout=0.0", "model.attention_dropout=0.0",
         "training.precision=fp32", "training.micro_batch_size=2", "training.tensorboard=false",
         "data.synthetic=true"]
# Two steps: the first creates the Adam moments, so the backward of the second is the first to
# run with every state allocated.
STEPS = 2



def _pipeline(pp: int, schedule: str = "", chunks: int = 1):
    """PP on `pp` stages under ZeRO-1 with `pp` micro-batches a step, one schedule."""
    items = [f"parallel.pipeline_parallel_size={pp}", "parallel.zero_stage=1"]
    if schedule:
        items.append(f"parallel.pipeline_schedule={schedule}")
    if chunks > 1:
        items.append(f"parallel.virtual_pipeline_size={chunks}")
    return items, pp


# name: (overrides, gradient accumulation). PP gets as many micro-batches as stages, so that stage
# 0 holds that many in flight under 1F1B; the others run one per step (the 2-core budget).
LAYOUTS = {
    "tp2": (["parallel.tensor_parallel_size=2", "parallel.zero_stage=1"], 1),
    "dp2_zero1": (["parallel.zero_stage=1"], 1),
    "dp2_zero3": (["parallel.zero_stage=3"], 1),
    "single": (["parallel.zero_stage=0"], 1),
    # bf16 weights at ZeRO-1: DeepSpeed's ZeRO optimizer, and its BF16_Optimizer with fp32
    # gradients (training.grad_accum_dtype=fp32)
    "dp2_zero1_bf16": (["parallel.zero_stage=1", "training.precision=bf16"], 1),
    "dp2_zero1_bf16acc": (["parallel.zero_stage=1", "training.precision=bf16",
                           "training.grad_accum_dtype=fp32"], 1),
}
# every pipeline schedule on two stages (the test) and four (benchmarks/pipeline/
# bench_pp4_memory.py, 4 ranks): 1F1B, ZB-H1 (deferred weight gradients), interleaved 1F1B and
# ZB-V over two chunks per rank
for _pp in (2, 4):
    LAYOUTS.update({f"pp{_pp}": _pipeline(_pp), f"pp{_pp}_zbh1": _pipeline(_pp, "zbh1"),
                    f"pp{_pp}v2": _pipeline(_pp, "interleaved", 2),
                    f"pp{_pp}_zbv": _pipeline(_pp, "zbv", 2)})
# No CPU profile is calibrated for this model: act_scale 1 (the formulas as they stand), fixed_gb
# 0 (the baseline removes the process's fixed memory), bucket_touched 1 (resident memory sees only
# the pages of DeepSpeed's 5e8-element bucket that gradients write).
CPU_CONSTANTS = Constants(act_scale=1.0, fixed_gb=0.0, bucket_touched=1.0)


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1)) / 1024.0


def layout_overrides(layout: str, world: int):
    """The config overrides of `layout` on `world` ranks and its (tp, pp, dp, micro-batch, ga)."""
    items, ga = LAYOUTS[layout]
    over = dict(item.split("=", 1) for item in items)
    tp = int(over.get("parallel.tensor_parallel_size", 1))
    pp = int(over.get("parallel.pipeline_parallel_size", 1))
    dp = world // (tp * pp)
    mb = int(dict(item.split("=", 1) for item in MODEL)["training.micro_batch_size"])
    overrides = MODEL + items + [f"training.global_batch_size={mb * dp * ga}",
                                 f"training.train_iters={STEPS}"]
    return overrides, (tp, pp, dp, mb, ga)


def planned(layout: str, world: int):
    """(Job, Layout) of `layout` on `world` ranks as the planner prices it. The planner names a
    schedule the trainer runs under another name with chunks (1f1b with chunks is the trainer's
    interleaved) by the record whose `chunked` it is."""
    overrides, (tp, pp, dp, mb, ga) = layout_overrides(layout, world)
    cfg = load_config(TINY, overrides)
    p = cfg.parallel
    job = Job(cfg.model, cfg.training.global_batch_size, cfg.training.precision,
              grad_accum=cfg.training.grad_accum_dtype)
    schedule = next((n for n in schedules.names() if schedules.get(n).chunked ==
                     p.pipeline_schedule), p.pipeline_schedule)
    lay = Layout(tp=tp, pp=pp, dp=dp, micro_batch=mb, grad_accum=ga, zero=p.zero_stage,
                 recompute="none", flash=True,  # CPU SDPA keeps no s x s scores
                 schedule=schedule, interleave=p.virtual_pipeline_size)
    return job, lay


def predicted_stage_gb(layout: str, world: int):
    """The planner's peak per pipeline stage, GiB (memory.memory_per_stage)."""
    job, lay = planned(layout, world)
    return [s.peak_bytes / GIB for s in memory_per_stage(job, lay, CPU_CONSTANTS)]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="a directory shared by the ranks")
    p.add_argument("--layouts", required=True)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    # Warm-up: the first train() imports DeepSpeed, joins the process group and starts torch's
    # thread pools; none of that belongs to a layout's figure.
    train(load_config(TINY, ["training.train_iters=1", "training.tensorboard=false",
                             f"training.global_batch_size={2 * world}", "parallel.zero_stage=1",
                             f"run.dir={os.path.join(args.out, 'warmup')}"]))
    results = {}
    for layout in args.layouts.split(","):
        overrides, _ = layout_overrides(layout, world)
        cfg = load_config(TINY, overrides + [f"run.dir={os.path.join(args.out, layout)}"])
        gc.collect()
        base = _status_mib("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        t0 = time.perf_counter()
        summary = train(cfg)
        seconds = time.perf_counter() - t0
        peak = _status_mib("VmHWM")
        del summary
        results[layout] = {"baseline_mib": base, "peak_mib": peak, "delta_mib": peak - base,
                           "seconds": seconds}
        gc.collect()
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    exit_after(main)
