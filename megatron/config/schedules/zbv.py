"""ZB-V (parallel.pipeline_schedule=zbv, parallel.virtual_pipeline_size=2; Qi et al. 2024,
"Pipeline Parallelism with Controllable Memory"): each of the p ranks holds two model chunks in a
V, rank r the chunks r and 2 p - 1 - r of 2 p equal blocks of layers, so the first chunk and the
last (embedding and head) share rank 0; each backward is split into B (the input gradient) and W
(the weight gradients), and the W passes fill what would be the bubble. The trainer runs it with
its own executor (engine/interleaved.py over engine/v_order.py's order, runner "v_stages").

Closed forms, balanced stages, a stage's pass times F + B + W per micro-batch (half of each per
chunk), F = B: no rank can start before the p - 1 chunk forwards ahead of it, and with m >= p
the order fills every other slot, so a step is m (F + B + W) + (p - 1) F / 2 (the replay with
F = B = W reaches it at m = p and within one chunk pass at larger m:
tests/unit/test_engine_v_order.py). A rank holds at most 2 p chunk activations between their F
and W: p micro-batches of a stage, the first stage's peak under 1F1B, on every stage."""
from __future__ import annotations

from typing import Optional

from megatron.config.errors import ConfigError
from megatron.config.schedules.registry import Pipe, Schedule, fill, register

CHUNKS = 2

# parallel.pipeline_schedule's value for it
NAME = "zbv"


def rule(pp: int, cp: int, chunks: int) -> Optional[ConfigError]:
    if pp == 1:
        return ConfigError("parallel.pipeline_schedule", NAME,
                           "1f1b without pipeline parallelism (pipeline_parallel_size=1): ZB-V "
                           "places chunks over several stages",
                           "set parallel.pipeline_parallel_size>1 or "
                           "parallel.pipeline_schedule=1f1b")
    if chunks != CHUNKS:
        return ConfigError("parallel.virtual_pipeline_size", chunks,
                           f"{CHUNKS} with parallel.pipeline_schedule=zbv: ZB-V holds exactly two "
                           "model chunks per rank, in a V",
                           f"set parallel.virtual_pipeline_size={CHUNKS}, or "
                           "parallel.pipeline_schedule=interleaved for other chunk counts")
    return None


def _idle(pipe: Pipe, w_share: float) -> float:
    """(p - 1) F / 2 in units of a stage's F + B + W, with F = B = (1 - w) / 2."""
    return (pipe.stages - 1) * (1 - w_share) / 4


def bubble(pipe: Pipe, w_share: float) -> float:
    idle = _idle(pipe, w_share)
    return idle / (pipe.micro_batches + idle)


def stored(pipe: Pipe, stage: int, per_mb: float, per_w: float) -> float:
    """At most 2 p chunk activations (half a stage's each), kept from F to W: p micro-batches'."""
    return min(pipe.stages, pipe.micro_batches) * max(per_mb, per_w)


def pipeline_time(pipe: Pipe, stages, weights, slowest: int):
    """m slots of the slowest stage, and a quarter of the others' F + B (their W runs in slots)
    for the fill: (p - 1) F / 2 when balanced and F = B."""
    w_fill = sum(w * n for w, (_, n) in zip(weights, stages)) - weights[slowest]
    return pipe.micro_batches * stages[slowest][0] + (fill(stages, slowest) - w_fill) / 4


ZBV = register(Schedule(
    name=NAME, title="zero-bubble ZB-V (two chunks per rank in a V)",
    priced="ZB-V: two chunks per rank in a V, W passes fill the bubble: (p - 1) F / 2 idle; "
           "every stage holds p micro-batches of activations",
    bubble=bubble, stored=stored, pipeline_time=pipeline_time, rule=rule, runner="v_stages",
    split_backward=True, head_on_first=True,
    # this trainer, the authors' Megatron-LM (zb24), AMD Primus's Megatron (primus25) and
    # torch's ZBVZeroBubble (fsdp)
    engines=("deepspeed", "megatron-lm", "megatron-core", "fsdp")))
