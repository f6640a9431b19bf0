"""1F1B (parallel.pipeline_schedule=1f1b, the default): DeepSpeed's TrainSchedule. Each stage
warms up with forwards, then alternates one forward and one backward, and drains: 2 (m + p - 1)
lock steps (engine/pipe_order), a bubble of (p - 1)/(m + p - 1) of a balanced pipeline
(Narayanan et al. 2021, section 2.2.1). The planner also prices Megatron-LM's interleaved variant
with v model chunks per stage (section 2.2.2); the trainer runs that one as the interleaved
schedule (interleaved.py), whose record reuses these closed forms."""
from __future__ import annotations

from megatron.config.schedules.registry import Pipe, Schedule, fill, register


def in_flight(pipe: Pipe, stage: int) -> float:
    """Micro-batches whose activations stage `stage` holds at once. Interleaved (v chunks of
    1/v of the stage), Megatron-LM warms up 2 (p - i - 1) + (v - 1) p chunks before its first
    backward: p + (p - 1)/v stage-equivalents on the first stage, the (1 + (p - 1)/(p v))
    factor of Korthikanti et al. 2022 section 4.2.3; with the micro-batches in groups of N
    (Pipe.group), (v - 1) N in place of (v - 1) p (engine/interleaved_order.warmup)."""
    v = pipe.chunks
    if v == 1:
        return max(1, min(pipe.stages - stage, pipe.micro_batches))
    chunks = 2 * (pipe.stages - stage - 1) + (v - 1) * (pipe.group or pipe.stages) + 1
    return max(1.0, min(chunks / v, float(pipe.micro_batches)))


def stored(pipe: Pipe, stage: int, per_mb: float, per_w: float) -> float:
    return in_flight(pipe, stage) * per_mb


def bubble(pipe: Pipe, w_share: float) -> float:
    """(p - 1)/(v m + p - 1): the fill and drain pass chunks of 1/v of a stage each."""
    p, m = pipe.stages, pipe.micro_batches
    return (p - 1) / (pipe.chunks * m + p - 1)


def pipeline_time(pipe: Pipe, stages, weights, slowest: int):
    """m slots of the slowest stage plus the fill and drain of the others, divided by v when
    interleaved: (m + p - 1) slots when balanced."""
    return pipe.micro_batches * stages[slowest][0] + fill(stages, slowest) / pipe.chunks


ONE_F_ONE_B = register(Schedule(
    name="1f1b", title="DeepSpeed's 1F1B",
    priced="bubble (p - 1)/(m + p - 1) of a balanced pipeline",
    bubble=bubble, stored=stored, pipeline_time=pipeline_time,
    runner="deepspeed", lock_steps=True, chunked="interleaved"))
