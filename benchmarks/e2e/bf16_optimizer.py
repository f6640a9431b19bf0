"""A megatron-train plugin for the end-to-end benchmark's `torch_bf16opt` run: DeepSpeed's
BF16_Optimizer instead of its ZeRO-1 optimizer, by asking DeepSpeed for fp32 gradient
accumulation (`data_types.grad_accum_dtype`), which with bf16 weights and ZeRO-1 selects it.
It keeps fp32 gradients in flat buffers and updates them a group at a time, where the ZeRO-1
optimizer loops over every parameter tensor (on the development CPU, 292 tensors: 14 ms of host
time a step against 30 ms, benchmarks/results/gpu_h200.md). Benchmark only: the trainer's
checkpoints of a ZeRO-1 run under BF16_Optimizer are not tested, nor does the planner price its
fp32 gradients."""
from __future__ import annotations

import sys

import deepspeed

_initialize = deepspeed.initialize


def _with_fp32_accumulation(*args, **kwargs):
    config = kwargs.get("config")
    if isinstance(config, dict):
        config.setdefault("data_types", {})["grad_accum_dtype"] = "fp32"
    result = _initialize(*args, **kwargs)
    # What DeepSpeed chose, in the run's log (the benchmark's test reads it).
    print(f"bf16_optimizer plugin: DeepSpeed's optimizer is {type(result[1]).__name__}",
          file=sys.stderr, flush=True)
    return result


deepspeed.initialize = _with_fp32_accumulation
