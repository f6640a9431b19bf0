"""ZB-H1 (parallel.pipeline_schedule=zbh1; Qi et al. 2023, "Zero Bubble Pipeline
Parallelism"): DeepSpeed's 1F1B lock steps with each backward split into B (the input gradient,
which the previous stage waits for) and W (the weight gradients, which only the optimizer step
needs); W passes fill the slots where a stage would idle. The engine runs it with
engine/zero_bubble.py, the order is engine/pipe_order's; docs/pipeline.md."""
from __future__ import annotations

from typing import Optional, Tuple

from megatron.config.errors import ConfigError
from megatron.config.schedules.registry import Pipe, Schedule, fill, register

# parallel.pipeline_schedule's value for it
NAME = "zbh1"


def rule(pp: int, cp: int, chunks: int) -> Optional[ConfigError]:
    """It reorders a pipeline's passes: with one stage there is nothing to reorder. The planner
    prices it for plain stages only (neither Qi et al. nor this trainer interleaves it). Context
    parallelism runs under it (Ulysses and ring: tests/distributed/test_parallel_ring_attention.py)."""
    if pp == 1:
        return ConfigError("parallel.pipeline_schedule", NAME,
                           "1f1b without pipeline parallelism (pipeline_parallel_size=1): the "
                           "zero-bubble schedule fills a pipeline's bubble and one stage has none",
                           "set parallel.pipeline_parallel_size>1 or "
                           "parallel.pipeline_schedule=1f1b")
    if chunks > 1:
        return ConfigError("parallel.pipeline_schedule", NAME,
                           "plain stages: zbh1 is priced for plain stages only, not with the "
                           "interleaved schedule", "leave out --interleave, or price 1f1b")
    return None


def stored(pipe: Pipe, stage: int, per_mb: float, per_w: float) -> float:
    """Bytes stage `stage` holds at its peak: micro-batches between F and B keep per_mb (as
    under 1F1B, at most k = min(p - stage, m) of them), those between B and W keep per_w, and
    engine/pipe_order holds at most n = min(p, m) in all. The schedule reaches the states
    (k, n - k) and (k - 1, n - k + 1) (tests/unit/test_planner_zero_bubble.py replays it), so
    the peak is (k - 1) per_mb + (n - k) per_w + max(per_mb, per_w)."""
    k = min(pipe.stages - stage, pipe.micro_batches)
    n = min(pipe.stages, pipe.micro_batches)
    return (k - 1) * per_mb + (n - k) * per_w + max(per_mb, per_w)


def bubble(pipe: Pipe, w_share: float) -> float:
    """With W taking w_share of a stage's time per micro-batch: (p - 1)(1 - 2w) + max(0, p - m) w
    idle slots against m busy ones (a third of 1F1B's bubble at w = 1/3 and m >= p)."""
    p, m = pipe.stages, pipe.micro_batches
    idle = (p - 1) * (1 - 2 * w_share) + max(0, p - m) * w_share
    return idle / (m + idle)


def pipeline_time(pipe: Pipe, stages, weights, slowest: int):
    """The W of every stage but the slowest moves into the fill and drain, twice (its own slot
    and the B wave that no longer waits for it): (p - 1)(F + B - W) when balanced; with fewer
    micro-batches than stages the schedule has only m W passes to place and p - m of the slowest
    stage's stay exposed. Balanced: m (F + B + W) + (p - 1)(F + B - W) + max(0, p - m) W, what
    engine/pipe_order.makespan replays."""
    w_fill = sum(w * n for w, (_, n) in zip(weights, stages)) - weights[slowest]
    exposed = max(0, pipe.stages - pipe.micro_batches) * weights[slowest]
    return (pipe.micro_batches * stages[slowest][0] + fill(stages, slowest) - 2 * w_fill
            + exposed)


def peak_stages(pipe: Pipe, num_layers: int) -> Tuple[int, ...]:
    """A later stage holds more pending W than stage 0 (stored), which outweighs its fewer
    activations when a pending W keeps more than a micro-batch in flight (full recompute):
    stage p - 2 and the last of the uneven split's larger stages count too."""
    return max(0, pipe.stages - 2), max(0, num_layers % pipe.stages - 1)


ZBH1 = register(Schedule(
    name=NAME, title="zero-bubble ZB-H1",
    priced="zero-bubble ZB-H1: W passes fill the bubble; each stage holds up to p micro-batches, "
           "those past their B with the inputs and output gradients their W keeps",
    bubble=bubble, stored=stored, pipeline_time=pipeline_time, rule=rule,
    runner="zero_bubble", split_backward=True, lock_steps=True, peak_stages=peak_stages,
    # this trainer; Megatron-DeepSpeed's --enable-zbh1-pipeline (its pull request 396); the
    # authors' Megatron-LM (zb24's runs); AMD Primus's Megatron (megatron-core). Not Megatron-LM
    # of 2021, Aleph Alpha's Scaling, or torch's pipelining, whose zero-bubble schedules are
    # interleaved or V-shaped
    engines=("deepspeed", "megatron-deepspeed", "megatron-lm", "megatron-core")))
