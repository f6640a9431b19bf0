"""Interleaved 1F1B (parallel.pipeline_schedule=interleaved; Narayanan et al. 2021, section
2.2.2, Megatron-LM's virtual pipeline): each of the p ranks holds v = parallel.
virtual_pipeline_size model chunks, rank r the chunks r, r + p, ..., r + (v - 1) p of p v equal
blocks of layers. The fill and drain pass chunks of 1/v of a stage, so the bubble is
(p - 1)/(v m + p - 1) of a balanced pipeline instead of (p - 1)/(m + p - 1), for v times the
point-to-point transfers and more activations held on the first stage (in_flight below).

Its closed forms are those the planner already prices for 1f1b with chunks (one_f_one_b.py:
Pipe.chunks); this record exists because the trainer runs it with an executor of its own
(engine/interleaved.py, runner "virtual_stages"), not with DeepSpeed's PipelineEngine, which holds one
contiguous stage per rank (DeepSpeed#4035). The order is engine/interleaved_order.py's."""
from __future__ import annotations

from typing import Optional

from megatron.config.errors import ConfigError
from megatron.config.schedules import one_f_one_b
from megatron.config.schedules.registry import Pipe, Schedule, register

# parallel.pipeline_schedule's value for it
NAME = "interleaved"


def rule(pp: int, cp: int, chunks: int) -> Optional[ConfigError]:
    """Several chunks on each of several stages (with context parallelism too: the executor
    sends each rank's 1/cp of the sequence, engine/chunks.py)."""
    if pp == 1:
        return ConfigError("parallel.pipeline_schedule", NAME,
                           "1f1b without pipeline parallelism (pipeline_parallel_size=1): "
                           "interleaving orders the chunks of several stages",
                           "set parallel.pipeline_parallel_size>1 or "
                           "parallel.pipeline_schedule=1f1b")
    if chunks < 2:
        return ConfigError("parallel.pipeline_schedule", NAME,
                           f"parallel.virtual_pipeline_size > 1 (it is {chunks}): with one "
                           "chunk per rank the schedule is DeepSpeed's 1f1b",
                           "set parallel.virtual_pipeline_size=2 or more, or "
                           "parallel.pipeline_schedule=1f1b")
    return None


def in_flight(pipe: Pipe, stage: int) -> float:
    """Megatron-LM's warm-up: 2 (p - stage - 1) + (v - 1) p chunk forwards before the first
    backward, plus the one in steady state, in stage-equivalents (one_f_one_b.in_flight)."""
    return one_f_one_b.in_flight(pipe, stage)


def stored(pipe: Pipe, stage: int, per_mb: float, per_w: float) -> float:
    return in_flight(pipe, stage) * per_mb


INTERLEAVED = register(Schedule(
    name=NAME, title="interleaved 1F1B (virtual pipeline stages)",
    priced="interleaved 1F1B: bubble (p - 1)/(v m + p - 1); the first stage holds "
           "p + (p - 1)/v micro-batches of activations",
    bubble=one_f_one_b.bubble, stored=stored, pipeline_time=one_f_one_b.pipeline_time,
    rule=rule, runner="virtual_stages",
    # Megatron-LM's schedule since Narayanan et al. 2021, torch's Interleaved1F1B (fsdp) and
    # this trainer; not DeepSpeed's pipeline engine (megatron-deepspeed) or Aleph Alpha's
    # Scaling, whose 1F1B runs one chunk a stage
    engines=("deepspeed", "megatron-lm", "megatron-lm-2021", "megatron-core", "fsdp")))
