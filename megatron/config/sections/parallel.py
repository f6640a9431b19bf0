"""The parallel section: how the ranks split the model and the batch (the layout), read by the
rank grid, the model builders, the engine and the planner."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from megatron.config import context_parallel, schedules
from megatron.config.sections.checks import check_choices, choice, positive, registry


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    """Ranks each layer's weights are split over (Megatron's tensor parallelism)."""
    pipeline_parallel_size: int = 1
    """Pipeline stages the layers are split over. Data parallel size is derived:
    world / (tensor_parallel_size x pipeline_parallel_size x context_parallel_size)."""
    zero_stage: int = 1
    """DeepSpeed ZeRO stage, 0 to 3: what the data-parallel ranks partition (1: optimizer
    states, 2: and gradients, 3: and parameters). Pipeline parallelism allows 0 or 1. Over one
    data-parallel rank (and no context parallelism) ZeRO shards nothing but still costs
    DeepSpeed's gradient copies: start-up says so where 0 is allowed."""
    sequence_parallel: bool = False
    """Megatron's sequence parallelism: the norms and dropouts between tensor-parallel regions
    hold 1/tensor_parallel_size of the sequence, saving activation memory."""
    tp_backward_overlap: bool = True
    """A column-parallel layer's backward (QKV, fc1, the output head) starts the all-reduce of its
    input gradient across the tensor-parallel ranks (with sequence_parallel its reduce-scatter)
    asynchronously and computes its weight gradient while it runs, as Megatron-LM's asynchronous
    TP all-reduce; the gradients are bit-identical either way. false: the collective, then the
    weight gradient (Megatron-LM's --no-async-tensor-model-parallel-allreduce), e.g. to rule it
    out when a run hangs or slows. Nothing changes at tensor_parallel_size 1."""
    context_parallel_size: int = 1
    """Context parallelism (Megatron's name; DeepSpeed-Ulysses' all-to-all algorithm, Megatron's
    cp_comm_type=a2a): each of these ranks holds 1/context_parallel_size of every sequence and
    attention exchanges heads for sequence around itself (docs/context_parallel.md). 1: off."""
    context_parallel_algo: context_parallel.Algo = context_parallel.DEFAULT
    """How the context-parallel ranks attend over the whole sequence (config/context_parallel.py,
    docs/context_parallel.md): ulysses (head exchange, the default), ring (key/value blocks
    travel around the group: no head cap), allgather (key/value heads gathered once: for GQA),
    hybrid (Ulysses inside groups of ulysses_degree ranks x ring across them)."""
    ulysses_degree: int = 0
    """Ranks of one Ulysses group under context_parallel_algo=hybrid (a divisor of
    context_parallel_size between 2 and half of it); 0: implied by the algorithm (all of
    context_parallel_size for ulysses, 1 for ring and allgather). Refused past 1 without
    context parallelism."""
    pipeline_partition_method: Literal["uniform", "parameters"] = "uniform"
    """DeepSpeed's pipeline partitioning: uniform spreads the transformer layers evenly over the
    stages; parameters balances their parameter counts."""
    pipeline_first_stage_layers: int = 0
    """Transformer layers on the first pipeline stage, which also holds the embedding (Megatron-
    LM's --decoder-first-pipeline-num-layers); the stages without a set count split the rest
    evenly, at least one layer each (config/stages.py). With virtual_pipeline_size > 1, the
    layers of the first model chunk, the rest split evenly over the other chunks. 0: not set.
    Replaces pipeline_partition_method."""
    pipeline_last_stage_layers: int = 0
    """Transformer layers on the last pipeline stage, which also holds the output layer and the
    loss (--decoder-last-pipeline-num-layers); as pipeline_first_stage_layers. 0: not set."""
    pipeline_embedding_as_layer: bool = False
    """Count the embedding as one transformer layer when the layers are split evenly over the
    pipeline's stages (or model chunks): the first one holds one layer fewer, none when each
    holds one (Megatron Core's --account-for-embedding-in-pipeline-split; Llama 3 405B's
    embedding-only first chunk). model.num_layers plus the counted ends must split evenly.
    Not with set first/last stage layers (config/stages.py)."""
    pipeline_loss_as_layer: bool = False
    """Count the output layer and the loss as one transformer layer, as
    pipeline_embedding_as_layer does the embedding: the last stage (or model chunk) holds one
    layer fewer, none when each holds one (--account-for-loss-in-pipeline-split)."""
    pipeline_schedule: str = field(default=schedules.DEFAULT, metadata=registry(
        schedules.names, "config/schedules/"))
    """The pipeline schedule (pipeline_parallel_size > 1), a record of config/schedules: 1f1b is
    DeepSpeed's; zbh1 is the zero-bubble ZB-H1 schedule (Qi et al. 2023): each backward split into
    an input-gradient pass and a deferred weight-gradient pass that fills the bubble;
    interleaved is Megatron-LM's interleaved 1F1B over virtual_pipeline_size chunks per rank;
    zbv is ZB-V (Qi et al. 2024): virtual_pipeline_size=2 chunks per rank in a V, with ZB-H1's
    split backward. The same gradients (docs/pipeline.md)."""
    virtual_pipeline_size: int = 1
    """Model chunks per pipeline rank (Megatron's virtual pipeline size v), run by
    pipeline_schedule=interleaved (rank r holds chunks r, r + pp, ... of pp x v equal blocks of
    layers, for a bubble v times smaller) or zbv (v = 2: chunks r and 2 pp - 1 - r). 1: one
    contiguous stage per rank. docs/pipeline.md."""
    pipeline_microbatch_group: int = 0
    """Under pipeline_schedule=interleaved: the micro-batches that pass a model chunk in a row
    before the next chunk takes them (Megatron Core's --microbatch-group-size-per-virtual-
    pipeline-stage), between pipeline_parallel_size and the step's micro-batches; a last,
    smaller group must hold at least pipeline_parallel_size. 0: pipeline_parallel_size, which
    needs the micro-batches in multiples of it; a larger group runs other micro-batch counts
    (10 on 4 stages in groups of 5) for (v - 1) x (group - pipeline_parallel_size) more chunk
    activations held in the warm-up. docs/pipeline.md."""
    timeout_minutes: int = 10
    """Minutes a rank waits for the others in the rendezvous and start-up before the job fails
    instead of hanging (torch's default: 10). From the first step on, the hang watchdog's limits
    set the process groups' timeout (resilience.startup_timeout_minutes for the first step and
    save, then hang_timeout_minutes or 5x the slowest phase, plus one minute); with the watchdog
    off (both 0) this stays the timeout of every collective."""
    expert_parallel_size: int = 1
    """Ranks of a pipeline stage the experts of each MoE layer are split over (docs/moe.md,
    "MoE parallel folding": tensor-parallel ranks first, then data x context parallel ones, so
    it may exceed the data-parallel size); a divisor of model.moe.num_experts and of the
    stage's data x context x tensor parallel ranks."""

    def __post_init__(self):
        s = "parallel"
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "context_parallel_size",
                     "expert_parallel_size", "virtual_pipeline_size", "timeout_minutes"):
            positive(s, name, getattr(self, name))
        for name in ("ulysses_degree", "pipeline_first_stage_layers",
                     "pipeline_last_stage_layers", "pipeline_microbatch_group"):
            positive(s, name, getattr(self, name), allow_zero=True)
        choice(s, "zero_stage", self.zero_stage, (0, 1, 2, 3))
        check_choices(s, self)
