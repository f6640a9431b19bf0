"""A 3D layout (what the search varies) and a job (what it does not)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from megatron.config import ModelConfig, context_parallel, schedules
from megatron.config.errors import ConfigError
from megatron.config.interleaving import chunk_rule, micro_batch_rule
from megatron.config.schedules import Pipe
from megatron.config.stages import (accounted_problem, chunk_ends, even_stage_layers,
                                    rank_layer_indices, rank_layers)
from megatron.config.stages import stage_layers as config_stage_layers
from megatron.config.stages import uneven_problem as stages_uneven_problem
from megatron.config.validate import (expert_stages_error, experts_error, layout_error,
                                      ramp_layout_error, schedule_error)
from megatron.planner.overlap import DEEPSPEED, OVERLAP, Refusal
from megatron.planner.problem import config_problem

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Job:
    model: ModelConfig
    global_batch: int
    precision: str = "bf16"
    # The config's validated `deepspeed:` section (Config.deepspeed): the bucket, overlap and
    # communication settings the trainer will merge into deepspeed.json (zero_settings.py).
    deepspeed: Dict[str, Any] = field(default_factory=dict)
    # The gradient buffers' and reduction's dtype when the user fixes it (grad_dtype.py:
    # Megatron's --grad-reduce-in-bf16); None: each engine's default.
    grad_dtype: Optional[str] = None
    # training.grad_accum_dtype: "fp32" with bf16 at ZeRO-1 is DeepSpeed's BF16_Optimizer
    # (base/optimizer_kind.py), whose fp32 gradient buffer memory.state_bytes prices.
    grad_accum: str = "model"
    # FP8 matrix multiplies in the transformer layers' linear layers (planner/fp8.py: priced
    # only, this trainer has no FP8); fp8_params: their weights held in FP8 too (NeMo's
    # fp8_params, Megatron-LM's --fp8-param-gather)
    fp8: bool = False
    fp8_params: bool = False
    # The base config's training.rampup_batch_size ([start, increment, samples]): each batch on
    # it must split as the trainer splits it (ramp_problem); priced at the whole batch.
    ramp: Optional[Tuple[int, int, int]] = None

    @property
    def seq(self) -> int:
        return self.model.seq_length


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    micro_batch: int
    grad_accum: int
    zero: int = 1
    recompute: str = "none"
    flash: bool = True
    sequence_parallel: bool = False
    # Model chunks per pipeline stage (Megatron-LM's interleaved 1F1B schedule, Narayanan et al.
    # 2021 section 2.2.2). 1 is the plain 1F1B schedule DeepSpeed's pipeline engine runs; more
    # is what the trainer's interleaved (and ZB-V) executor runs (chunks_note).
    interleave: int = 1
    # parallel.pipeline_schedule: the name of a record of config/schedules, which prices it
    # (DeepSpeed's 1F1B by default; zero-bubble ZB-H1 and ZB-V, PP > 1, split each backward into
    # B, the input gradient, and a deferred W, the weight gradients)
    schedule: str = schedules.DEFAULT
    # parallel.context_parallel_size (Ulysses, docs/context_parallel.md): each of the cp ranks
    # of a group holds s/cp of every sample; attention exchanges heads for the sequence. The
    # dp ranks are data-parallel replicas of cp-rank groups: world = tp x cp x dp x pp.
    cp: int = 1
    # Transformer layers on the first and on the last stage when the user fixes them
    # (Megatron-LM's --decoder-first/last-pipeline-num-layers, which recipes lower to make
    # room for the embedding and the logits); the other stages share the rest evenly. None:
    # the even split (stage_layers). The trainer's parallel.pipeline_first_stage_layers and
    # pipeline_last_stage_layers (config/stages.py).
    first_stage_layers: Optional[int] = None
    last_stage_layers: Optional[int] = None
    # parallel.expert_parallel_size (docs/moe.md): each rank holds num_experts / ep experts,
    # the ep ranks consecutive data-parallel ranks; expert states are partitioned over the
    # expert-data-parallel group of dp x cp / ep ranks.
    ep: int = 1
    # parallel.context_parallel_algo and ulysses_degree (docs/context_parallel.md): how the cp
    # ranks split attention: ulysses (heads), ring / allgather (key/value blocks travel or are
    # gathered), hybrid (Ulysses inside groups of ulysses_degree ranks x ring across them).
    cp_algo: str = context_parallel.DEFAULT
    ulysses_degree: int = 0
    # parallel.pipeline_embedding_as_layer / pipeline_loss_as_layer (config/stages.py): the
    # embedding, the output layer and loss each take one layer's place in the even split, so
    # their chunks hold one layer fewer, none when each chunk holds one (Llama 3 405B)
    embedding_as_layer: bool = False
    loss_as_layer: bool = False
    # parallel.pipeline_microbatch_group under the interleaved schedule: the micro-batches a
    # chunk takes in a row (0: pp), which lets a step's micro-batches be other than a multiple
    # of pp (config/interleaving.group_fits) for (v - 1)(N - pp) more chunks in flight
    microbatch_group: int = 0
    # Transformer layers of each stage where the engine splits them itself by a compute cost
    # (Overlap.cost_split: nanotron, cost_split_layers), any count a stage; (): the trainer's
    # split (first/last counts, ends counted, else even). One model chunk a stage.
    stage_counts: Tuple[int, ...] = ()

    @property
    def cp_parts(self) -> Tuple[int, int]:
        """(U, R): ranks exchanging heads (Ulysses) and ranks the key/values travel over."""
        if self.cp == 1:
            return 1, 1
        return context_parallel.degrees(self.cp_algo, self.cp, self.ulysses_degree)

    @property
    def counted(self) -> int:
        """The ends counted as a layer: 0, 1 or 2."""
        return int(self.embedding_as_layer) + int(self.loss_as_layer)

    @property
    def uneven(self) -> bool:
        return (self.first_stage_layers is not None or self.last_stage_layers is not None
                or self.counted > 0 or bool(self.stage_counts))

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def zero_dp(self) -> int:
        """Ranks the gradients are averaged over and ZeRO partitions over: dp x cp."""
        return self.dp * self.cp

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.dp

    @property
    def head_stage(self) -> int:
        """The stage holding the output layer, final norm and loss: the last, or the first
        where the schedule's chunks run in a V (Schedule.head_on_first: ZB-V)."""
        return 0 if schedules.get(self.schedule).head_on_first else self.pp - 1

    @property
    def pipe(self) -> Pipe:
        """What the schedule's closed forms read: stages, micro-batches, chunks per stage."""
        return Pipe(self.pp, self.grad_accum, self.interleave, self.microbatch_group)

    def key(self) -> str:
        return (f"tp{self.tp}-pp{self.pp}-dp{self.dp}-mb{self.micro_batch}-ga{self.grad_accum}"
                f"-z{self.zero}-{self.recompute}-{'flash' if self.flash else 'noflash'}"
                f"{'-sp' if self.sequence_parallel else ''}"
                f"{f'-v{self.interleave}' if self.interleave > 1 else ''}"
                f"{f'-{self.schedule}' if self.schedule != schedules.DEFAULT else ''}"
                f"{f'-cp{self.cp}' if self.cp > 1 else ''}"
                f"{f'-first{self.first_stage_layers}' if self.first_stage_layers else ''}"
                f"{f'-last{self.last_stage_layers}' if self.last_stage_layers else ''}"
                f"{'-embl' if self.embedding_as_layer else ''}"
                f"{'-lossl' if self.loss_as_layer else ''}"
                f"{f'-g{self.microbatch_group}' if self.microbatch_group else ''}"
                f"{f'-ep{self.ep}' if self.ep > 1 else ''}"
                f"{'-split' + '.'.join(map(str, self.stage_counts)) if self.stage_counts else ''}"
                f"{f'-{self.cp_label()}' if self.cp > 1 and self.cp_algo != 'ulysses' else ''}")

    def cp_label(self) -> str:
        """The context-parallel algorithm, with its Ulysses degree under hybrid ("hybrid2")."""
        return f"hybrid{self.ulysses_degree}" if self.cp_algo == "hybrid" else self.cp_algo

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: Dict[str, Any]) -> "Layout":
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in raw.items() if k in names}
        fields["stage_counts"] = tuple(fields.get("stage_counts", ()))  # a JSON list
        return cls(**fields)


def layout_problem(job: Job, lay: Layout, framework: str = "deepspeed") -> Optional[str]:
    """Why the trainer would refuse this layout, or None: the trainer's own rules
    (megatron/config/validate.py, layout_error) plus what a Layout adds (its batch split,
    recompute name, the interleaved schedule's divisibility). framework: the engine priced
    (overlap.FRAMEWORKS); DeepSpeed's own ZeRO limits (ZeRO-0/1 under its pipeline engine,
    no ZeRO-3 with split experts) bind only the DeepSpeed engines: FSDP keeps ZeRO-2/3 under
    a pipeline."""
    m = job.model
    if lay.global_batch != job.global_batch:
        return f"micro-batch x accumulation x DP = {lay.global_batch} != global batch"
    zero = lay.zero if framework in DEEPSPEED else min(lay.zero, 1)
    error = layout_error(m, lay.tp, lay.pp, zero, lay.sequence_parallel, job.deepspeed,
                         cp=lay.cp, ep=lay.ep, cp_algo=lay.cp_algo,
                         ulysses_degree=lay.ulysses_degree,
                         # stages without a layer: the ends counted as one, or an engine's own
                         # split's (nanotron's 3B on 32 stages: 28 layers)
                         counted=lay.counted or lay.stage_counts.count(0))
    if error is not None:
        return config_problem(error)
    # The trainer accepts SP at TP 1, where it changes nothing: not a layout worth pricing.
    if lay.sequence_parallel and lay.tp == 1:
        return "sequence parallelism needs TP > 1"
    if lay.recompute not in RECOMPUTE:
        return f"recompute {lay.recompute!r} is not one of {RECOMPUTE}"
    return (schedule_problem(lay) or interleave_problem(m.num_layers, lay)
            or uneven_problem(m.num_layers, lay) or expert_problem(job, lay)
            or ramp_problem(job, lay) or engine_run_problem(framework, lay, m))


def ramp_problem(job: Job, lay: Layout) -> Optional[str]:
    """The trainer's rule for the base config's batch-size ramp (config/validate.
    ramp_layout_error): every batch on it whole micro-batches on each data-parallel rank, in
    the groups the layout's pipeline schedule runs."""
    if job.ramp is None:
        return None
    return config_problem(ramp_layout_error(list(job.ramp), job.global_batch, lay.micro_batch,
                                            lay.dp, run_as(lay), lay.pp, lay.interleave,
                                            lay.microbatch_group))


def engine_run_problem(framework: str, lay: Layout,
                       m: Optional[ModelConfig] = None) -> Optional[Refusal]:
    """Why the engine `framework` cannot run the layout's pipeline schedule (the engines its
    record names, config/schedules; with model chunks the schedule it runs as, run_as), its
    context parallelism or its recompute policy (the engine's Overlap.cp_algos, recomputes),
    or the model m's experts (Overlap.experts), or None. This trainer (deepspeed) runs them
    all."""
    ov = OVERLAP.get(framework)
    if ov is None:
        return None
    name = run_as(lay)
    engines = schedules.get(name).engines
    if (lay.pp > 1 or lay.interleave > 1) and engines is not None and framework not in engines:
        return Refusal(f"--schedule {name} under framework {framework} ({ov.runs or framework}; "
                       f"the engines that run {name}: {', '.join(engines)})",
                       key=f"--schedule {name}")
    if lay.cp > 1 and ov.cp_algos is not None and lay.cp_algo not in ov.cp_algos:
        return Refusal(f"--cp {lay.cp} --cp-algo {lay.cp_algo} under framework {framework} "
                       f"({ov.runs}; its context parallelism: {', '.join(ov.cp_algos) or 'none'})",
                       key="--cp > 1" if ov.cp_algos == () else f"--cp-algo {lay.cp_algo}")
    if ov.recomputes is not None and lay.recompute not in ov.recomputes:
        return Refusal(f"--recompute {lay.recompute} under framework {framework} ({ov.runs}; "
                       f"its recompute: {', '.join(ov.recomputes)})",
                       key=f"--recompute {lay.recompute}")
    if m is not None and m.moe.num_experts and not ov.experts:
        return Refusal(f"a model with {m.moe.num_experts} experts under framework {framework} "
                       f"({ov.runs})", key=f"a model with {m.moe.num_experts} experts")
    if m is not None and m.moe.num_experts and ov.expert_tp and lay.zero_dp % lay.ep:
        # planner/experts.expert_dp: these engines carve EP out of data x context parallel
        return Refusal(f"--ep {lay.ep} under framework {framework} ({ov.runs}: experts split "
                       f"over TP, EP out of the {lay.zero_dp} data x context parallel ranks, "
                       "which it must divide)", key="--ep not dividing dp x cp")
    return None


def expert_problem(job: Job, lay: Layout) -> Optional[str]:
    """The trainer's own rules (config/validate.experts_error, expert_stages_error) for a
    layout's experts: with them split over ranks, a MoE layer on every pipeline stage (among
    all of its model chunks' layers under interleaving or ZB-V)."""
    error = experts_error(job.model, lay.tp, lay.cp, lay.tp * lay.dp * lay.cp, lay.ep, lay.zero,
                          job.precision, lay.sequence_parallel)
    if error is None and lay.pp > 1:
        error = expert_stages_error(job.model, lay.tp, lay.ep,
                                    layout_stage_layer_indices(job.model.num_layers, lay))
    return config_problem(error)


def schedule_problem(lay: Layout) -> Optional[str]:
    """The rule of the schedule's record (config/schedules), the trainer's, with the layout's
    stages, context parallelism and the interleaved comparison's chunks per stage."""
    if lay.schedule not in schedules.names():
        return f"pipeline schedule {lay.schedule!r} is not one of {schedules.names()}"
    error = schedule_error(lay.schedule, lay.pp, lay.cp, lay.interleave)
    return config_problem(error)


def run_as(lay: "Layout") -> str:
    """The schedule the trainer runs a layout under: with chunks, a record may run under
    another name (1f1b's chunked form is the interleaved schedule), as emit.layout_config
    writes it."""
    record = schedules.get(lay.schedule)
    return record.chunked if lay.interleave > 1 and record.chunked else lay.schedule


def chunks_note(lay: "Layout") -> str:
    """What `memory` and `scaling` print of a layout with chunks: the schedule and settings
    the trainer runs it with, and what the chunked executor runs."""
    name = run_as(lay)
    return (f"{schedules.get(name).title}, {lay.interleave} chunks per stage: the trainer runs "
            f"it as parallel.pipeline_schedule={name} with parallel.virtual_pipeline_size="
            f"{lay.interleave} (fp32 or bf16, ZeRO-1, dense models)")


def interleave_problem(num_layers: int, lay: Layout) -> Optional[str]:
    """The trainer's rules for chunks per stage (config/interleaving.py: v chunks of equal
    layer count on every stage unless first/last counts are set, the schedule's own chunk
    count, and micro-batches in multiples of the stage count under the interleaved order)."""
    v = lay.interleave
    if v == 1:  # a micro-batch group without chunks is refused as the trainer refuses it
        error = (micro_batch_rule(run_as(lay), lay.pp, 1, lay.micro_batch, lay.dp,
                                  lay.global_batch, lay.microbatch_group)
                 if lay.microbatch_group else None)
        return config_problem(error)
    if v < 1 or lay.pp < 2:
        return f"interleave {v} needs PP > 1 and at least one chunk per stage"
    name = run_as(lay)
    error = (chunk_rule(num_layers, lay.pp, lay.cp, v, name, lay.uneven)
             or micro_batch_rule(name, lay.pp, v, lay.micro_batch, lay.dp, lay.global_batch,
                                 lay.microbatch_group))
    return config_problem(error)


def stage_layers(num_layers: int, pp: int) -> List[int]:
    """Transformer layers per stage, spread evenly (config/stages.py: the trainer's split)."""
    return even_stage_layers(num_layers, pp)


def cost_split_layers(m: ModelConfig, pp: int) -> Tuple[int, ...]:
    """Transformer layers per stage as nanotron splits them (models/base.py at e24d2483, with
    models/llama.py's get_block_compute_costs): its pipeline blocks in order (the embedding,
    the layers, the final norm, the output layer, the cast and the loss) cost 0 but a layer,
    4 n (h/n) h + 3 f h (its q/k/v/o and MLP weights as multi-head attention's: the sweep's
    models have no grouped queries), and the output layer, V h; rank r takes
    blocks while their running total is at most (r + 1)/p of the whole, the block that passes
    it included. The last stages may hold no layer: 1B's 16 layers on 8 stages are 3, 3, 2,
    3, 2, 3, 0, 0, the output layer on the seventh, the cast and the loss on the eighth (the
    planner prices the output layer on the last stage: the same slowest stage)."""
    layer = 4 * m.num_attention_heads * (m.hidden_size // m.num_attention_heads) * \
        m.hidden_size + 3 * m.ffn_hidden_size * m.hidden_size
    costs = [0] + [layer] * m.num_layers + [0, m.vocab_size * m.hidden_size]
    total = sum(costs)
    counts, rank, running = [0] * pp, 0, 0
    for i, cost in enumerate(costs):
        running += cost
        counts[rank] += 1 <= i <= m.num_layers
        if running > total * (rank + 1) / pp:
            rank += 1
    return tuple(counts)


def engine_stage_counts(m: ModelConfig, pp: int, framework: str) -> Tuple[int, ...]:
    """The split an engine that places the layers by a compute cost of its own
    (Overlap.cost_split: nanotron) gives pp stages, cost_split_layers; () for any other engine,
    or one stage. The one place a layout learns its engine's split: the search, a published
    case and a case priced as another engine (sweeps.reframed) read it."""
    ov = OVERLAP.get(framework)
    return cost_split_layers(m, pp) if pp > 1 and ov is not None and ov.cost_split else ()


def _counts_problem(num_layers: int, lay: Layout) -> Optional[str]:
    """A set split (Layout.stage_counts): one count a stage summing to the layers (a stage may
    hold none: nanotron's blocks of no cost, the cast and the loss, may take a rank of their
    own), one model chunk a stage, no other split beside it."""
    counts = lay.stage_counts
    if (lay.first_stage_layers is not None or lay.last_stage_layers is not None
            or lay.counted or lay.interleave > 1):
        return "an engine's own stage split beside set end counts or model chunks"
    if len(counts) != lay.pp or sum(counts) != num_layers or min(counts) < 0:
        return (f"stage split {'/'.join(map(str, counts))} is not {lay.pp} stages holding the "
                f"{num_layers} layers")
    return None


def uneven_problem(num_layers: int, lay: Layout) -> Optional[str]:
    """The trainer's rule for set first/last stage layer counts, or for the ends counted as a
    layer, not both (config/stages.py, config/validate.stages_error); an engine's own split
    (Layout.stage_counts) its own rule."""
    if lay.stage_counts:
        return _counts_problem(num_layers, lay)
    if lay.counted:
        if lay.first_stage_layers is not None or lay.last_stage_layers is not None:
            return "set first/last stage layers beside the ends counted as a layer"
        return accounted_problem(num_layers, lay.pp, lay.interleave, lay.embedding_as_layer,
                                 lay.loss_as_layer)
    return stages_uneven_problem(num_layers, lay.pp, lay.first_stage_layers,
                                 lay.last_stage_layers, lay.interleave)


def layout_ends(num_layers: int, lay: Layout) -> Tuple[Optional[int], Optional[int]]:
    """(first, last) model-chunk layer counts of `lay`: the set ones, else those of the ends
    counted as a layer (config/stages.accounted_ends; 0 where a chunk holds an end alone)."""
    return chunk_ends(num_layers, lay.pp * lay.interleave, lay.first_stage_layers,
                      lay.last_stage_layers, lay.embedding_as_layer, lay.loss_as_layer)


def layout_stage_layers(num_layers: int, lay: Layout) -> List[int]:
    """Transformer layers per stage of `lay` (config/stages.py); with set first/last counts (or
    the ends counted as a layer) and model chunks, each rank's chunks summed, placed as the
    trainer places them (a V under ZB-V, else interleaved 1F1B's loop). An approximation for
    those: the closed forms price a rank's chunks as equal."""
    if lay.stage_counts:
        return list(lay.stage_counts)
    first, last = layout_ends(num_layers, lay)
    if lay.interleave > 1 and lay.uneven:
        return rank_layers(num_layers, lay.pp, lay.interleave,
                           schedules.get(lay.schedule).head_on_first, first, last)
    return config_stage_layers(num_layers, lay.pp, first, last)


def layout_stage_layer_indices(num_layers: int, lay: Layout) -> List[List[int]]:
    """The transformer layers each stage of `lay` holds (layout_stage_layers counts them): its
    model chunks' under interleaving or ZB-V (config/stages.rank_layer_indices), else its
    contiguous run."""
    counts = layout_stage_layers(num_layers, lay)
    if lay.interleave > 1:
        first, last = layout_ends(num_layers, lay)
        held = rank_layer_indices(num_layers, lay.pp, lay.interleave,
                                  schedules.get(lay.schedule).head_on_first, first, last)
        if [len(h) for h in held] == counts:
            return held
    starts = [sum(counts[:i]) for i in range(lay.pp)]
    return [list(range(a, a + n)) for a, n in zip(starts, counts)]


def check_layout(job: Job, lay: Layout, framework: str = "deepspeed") -> None:
    problem = layout_problem(job, lay, framework)
    if isinstance(problem, Refusal):  # the engine's, not the trainer's
        raise ConfigError("--framework", framework, f"an engine that runs layout {lay.key()} "
                          f"({problem})", "pick a layout it runs (--schedule, --interleave, "
                          "--cp, --cp-algo, --recompute) or another --framework "
                          "(docs/planner.md, Overlap by framework)")
    if problem:
        raise ConfigError("layout", lay.key(), f"a layout the trainer accepts ({problem})",
                          "pick another tensor/pipeline/micro-batch combination")
