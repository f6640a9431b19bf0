"""Checks that need several sections or the world size. Each raises one ConfigError."""
from __future__ import annotations

from typing import List, Optional

from megatron.config import context_parallel, schedules
from megatron.config.deepspeed_section import overlap_problem
from megatron.config.errors import ConfigError
from megatron.config.interleaving import chunks_error, interleaving_error, micro_batch_rule
from megatron.config.moe import is_moe_layer
from megatron.config.sections.optimizer import counts_samples, schedule_lengths
from megatron.config.sections.training import ramp_sizes
from megatron.config.stages import (accounted_problem, chunk_ends, rank_layer_indices,
                                    set_or_none, stage_layers, uneven_problem)


def data_parallel_size(cfg, world_size: int) -> int:
    p = cfg.parallel
    return world_size // (p.tensor_parallel_size * p.pipeline_parallel_size
                          * p.context_parallel_size)


def check_world(cfg, world_size: int) -> None:
    tp, pp = cfg.parallel.tensor_parallel_size, cfg.parallel.pipeline_parallel_size
    cp = cfg.parallel.context_parallel_size
    if world_size % (tp * pp * cp):
        names = "tensor_parallel_size x pipeline_parallel_size"
        sizes = f"{tp} x {pp}"
        if cp > 1:
            names, sizes = names + " x context_parallel_size", sizes + f" x {cp}"
        raise ConfigError("parallel.tensor_parallel_size", tp,
                          f"{names} ({sizes} = {tp * pp * cp}) "
                          f"to divide the world size {world_size}",
                          "launch a multiple of that many ranks or change the layout")


def tensor_parallel_error(m, tp: int, sequence_parallel: bool) -> Optional[ConfigError]:
    if m.num_attention_heads % tp:
        return ConfigError("model.num_attention_heads", m.num_attention_heads,
                           f"a multiple of parallel.tensor_parallel_size={tp}")
    if m.kv_heads % tp:
        return ConfigError("model.num_query_groups", m.kv_heads,
                           f"a multiple of parallel.tensor_parallel_size={tp} (each tensor-parallel "
                           "rank holds whole key/value groups)")
    if m.ffn_hidden_size % tp:
        return ConfigError("model.ffn_hidden_size", m.ffn_hidden_size,
                           f"a multiple of parallel.tensor_parallel_size={tp}")
    if sequence_parallel and m.seq_length % tp:
        return ConfigError("model.seq_length", m.seq_length,
                           f"a multiple of parallel.tensor_parallel_size={tp} with sequence parallelism")
    return None


def context_parallel_error(m, tp: int, cp: int, sequence_parallel: bool,
                           algo: str = context_parallel.DEFAULT, ulysses_degree: int = 0
                           ) -> Optional[ConfigError]:
    """The rules of the algorithm (config/context_parallel.py) for C = cp ranks: Ulysses'
    head cap on its own part only; the load balance of the ring part (2 chunks a rank). Without
    context parallelism a Ulysses degree past 1 is refused (it used to be dropped unread)."""
    if cp == 1:
        if ulysses_degree > 1:
            return ConfigError("parallel.ulysses_degree", ulysses_degree,
                               "0 without context parallelism (context_parallel_size=1): it "
                               "splits the context-parallel ranks of a hybrid",
                               "set parallel.context_parallel_size and "
                               "context_parallel_algo=hybrid, or parallel.ulysses_degree=0")
        return None
    error = _degree_error(algo, cp, ulysses_degree)
    if error:
        return error
    u, r = context_parallel.degrees(algo, cp, ulysses_degree)
    return _ulysses_error(m, tp, u, algo) or _sequence_error(m, tp, cp, r, sequence_parallel)


def _degree_error(algo: str, cp: int, ulysses_degree: int) -> Optional[ConfigError]:
    if algo == "hybrid":
        if ulysses_degree < 2 or ulysses_degree >= cp or cp % ulysses_degree:
            return ConfigError("parallel.ulysses_degree", ulysses_degree,
                               f"a divisor of parallel.context_parallel_size={cp} between 2 and "
                               f"{cp // 2} with parallel.context_parallel_algo=hybrid (Ulysses "
                               "inside groups of that many ranks x ring across them)",
                               "set parallel.ulysses_degree, or use context_parallel_algo=ring "
                               "or ulysses")
        return None
    implied = context_parallel.degrees(algo, cp)[0]
    if ulysses_degree not in (0, implied):
        return ConfigError("parallel.ulysses_degree", ulysses_degree,
                           f"0 or {implied} with parallel.context_parallel_algo={algo} "
                           f"(context_parallel_size={cp}); only hybrid chooses it",
                           "remove it, or set parallel.context_parallel_algo=hybrid")
    return None


def _ulysses_error(m, tp: int, u: int, algo: str) -> Optional[ConfigError]:
    """Ulysses' all-to-all deals each tensor-parallel rank's query heads out to its u ranks.
    Key/value heads need no rule: where a rank's are fewer than u (or do not split), the
    attention replicates them (megatron/parallel/ulysses.py)."""
    per_tp = m.num_attention_heads // tp
    if u == 1 or per_tp % u == 0:
        return None
    if algo == "hybrid":
        return ConfigError("parallel.ulysses_degree", u,
                           f"a divisor of the query heads per tensor-parallel rank "
                           f"(num_attention_heads / parallel.tensor_parallel_size = {per_tp})",
                           "lower parallel.ulysses_degree (the ring part has no head cap)")
    return ConfigError("model.num_attention_heads", m.num_attention_heads,
                       f"query heads per tensor-parallel rank (num_attention_heads / "
                       f"parallel.tensor_parallel_size = {per_tp}) to be a multiple of "
                       f"parallel.context_parallel_size={u}",
                       "change the head count, tensor_parallel_size or context_parallel_size, "
                       "or set parallel.context_parallel_algo=ring (no head cap)")


def _sequence_error(m, tp: int, cp: int, r: int, sequence_parallel: bool
                    ) -> Optional[ConfigError]:
    """Every rank holds s/cp tokens (s/(cp*tp) under Megatron SP); a ring of r ranks cuts the
    sequence into 2r chunks for its causal load balance."""
    shards = cp * tp if sequence_parallel and tp > 1 else cp
    if m.seq_length % shards:
        what = (f"parallel.context_parallel_size x tensor_parallel_size = {shards} with "
                "sequence parallelism" if shards != cp else f"parallel.context_parallel_size={cp}")
        return ConfigError("model.seq_length", m.seq_length, f"a multiple of {what}")
    if r > 1 and m.seq_length % (2 * r):
        return ConfigError("model.seq_length", m.seq_length,
                           f"a multiple of 2 x the ring degree = {2 * r}: the ring's causal load "
                           f"balance gives each of its {r} ranks two of {2 * r} equal chunks",
                           f"set model.seq_length to a multiple of {2 * r}")
    return None


def pipeline_error(m, pp: int, zero: int, counted: int = 0) -> Optional[ConfigError]:
    """counted: the ends counted as a layer (parallel.pipeline_embedding_as_layer and
    pipeline_loss_as_layer), whose stages may hold none."""
    if pp > 1 and zero > 1:
        return ConfigError("parallel.zero_stage", zero,
                           f"0 or 1 with pipeline parallelism (pipeline_parallel_size={pp}): "
                           "DeepSpeed's pipeline engine refuses ZeRO-2/3",
                           "set parallel.zero_stage=1 or parallel.pipeline_parallel_size=1")
    if m.num_layers + counted < pp:
        counts = (f" less the {counted} end(s) counted as a layer" if counted else "")
        return ConfigError("model.num_layers", m.num_layers,
                           f"at least parallel.pipeline_parallel_size={pp}{counts} (one layer "
                           "per stage)")
    return None


def deepspeed_error(deepspeed, pp: int, sequence_parallel: bool = False
                    ) -> Optional[ConfigError]:
    """An explicit deepspeed-section value the layout cannot honour. sequence_parallel: on
    and TP > 1."""
    problem = overlap_problem(deepspeed, pp)
    if problem:
        return ConfigError("deepspeed.zero_optimization.overlap_comm", True,
                           f"false or unset with parallel.pipeline_parallel_size={pp}: {problem}",
                           "remove it, or set parallel.pipeline_parallel_size=1")
    pipeline = (deepspeed or {}).get("pipeline") or {}
    for key in ("pipe_partitioned", "grad_partitioned"):
        if sequence_parallel and pp > 1 and pipeline.get(key):
            return ConfigError(f"deepspeed.pipeline.{key}", pipeline[key],
                               "false or unset with parallel.sequence_parallel=true: DeepSpeed "
                               "would split each TP rank's sequence shard as if replicated and "
                               "splice shards together on the next stage",
                               f"remove deepspeed.pipeline.{key}")
    return None


def moe_error(m, tp: int, pp: int, cp: int, zero: int, ep: int = 1) -> Optional[ConfigError]:
    """What mixture of experts runs with (docs/moe.md): experts split over the ranks of a
    pipeline stage (tensor, context and data parallel ones folded: parallel/experts.py)."""
    if m.moe.num_experts == 0:
        if ep > 1:
            return ConfigError("parallel.expert_parallel_size", ep, "1 for a dense model "
                               "(model.moe.num_experts=0)", "set model.moe.num_experts or "
                               "parallel.expert_parallel_size=1")
        return None
    if m.moe.num_experts % ep:
        return ConfigError("parallel.expert_parallel_size", ep,
                           f"a divisor of model.moe.num_experts={m.moe.num_experts} (each rank holds "
                           "num_experts / expert_parallel_size experts)")
    if (ep > 1 or tp > 1) and zero == 3:
        why = (f"parallel.expert_parallel_size={ep}" if ep > 1 else
               f"parallel.tensor_parallel_size={tp} (each TP rank trains the experts on "
               "other tokens)")
        return ConfigError("parallel.zero_stage", zero, f"0, 1 or 2 with mixture of experts "
                           f"and {why}: DeepSpeed's ZeRO-3 refuses expert parameters it did "
                           "not build", "set parallel.zero_stage=1")
    return None


def layout_error(m, tp: int, pp: int, zero: int, sequence_parallel: bool,
                 deepspeed=None, cp: int = 1, ep: int = 1,
                 cp_algo: str = context_parallel.DEFAULT, ulysses_degree: int = 0,
                 counted: int = 0) -> Optional[ConfigError]:
    """The first rule a layout of model section `m` breaks, or None: the one home of the layout
    rules, read by validate_for_world and by the planner (megatron/planner/layout.py), which
    prices only layouts the trainer accepts."""
    return (tensor_parallel_error(m, tp, sequence_parallel)
            or context_parallel_error(m, tp, cp, sequence_parallel, cp_algo, ulysses_degree)
            or pipeline_error(m, pp, zero, counted)
            or deepspeed_error(deepspeed or {}, pp, sequence_parallel and tp > 1)
            or moe_error(m, tp, pp, cp, zero, ep))


def _raise(error: Optional[ConfigError]) -> None:
    if error is not None:
        raise error


def check_tensor_parallel(cfg) -> None:
    _raise(tensor_parallel_error(cfg.model, cfg.parallel.tensor_parallel_size,
                                 cfg.parallel.sequence_parallel))


def check_context_parallel(cfg) -> None:
    p = cfg.parallel
    _raise(context_parallel_error(cfg.model, p.tensor_parallel_size, p.context_parallel_size,
                                  p.sequence_parallel, p.context_parallel_algo,
                                  p.ulysses_degree))
    _raise(context_parallel_combination_error(cfg))


def context_parallel_combination_error(cfg) -> Optional[ConfigError]:
    """What context parallelism does not (yet) run with, reported with the other context
    parallel rules: the pipeline schedule's own rule, which may refuse CP (config/schedules)."""
    p = cfg.parallel
    if p.context_parallel_size == 1:
        return None
    return schedule_error(p.pipeline_schedule, p.pipeline_parallel_size, p.context_parallel_size,
                          p.virtual_pipeline_size)


def schedule_error(schedule: str, pp: int, cp: int = 1, chunks: int = 1
                   ) -> Optional[ConfigError]:
    """The rule of the schedule's record (config/schedules): whether it runs on pp stages with
    cp context-parallel ranks and `chunks` model chunks per stage (the planner's interleaving)."""
    return schedules.get(schedule).rule(pp, cp, chunks)


def _set_counts(p):
    """(first, last) stage layer counts of the parallel section, None where not set."""
    return set_or_none(p.pipeline_first_stage_layers), set_or_none(p.pipeline_last_stage_layers)


def _ends(cfg):
    """(first, last) chunk layer counts the trainer splits by (config/stages.chunk_ends)."""
    p = cfg.parallel
    return chunk_ends(cfg.model.num_layers, p.pipeline_parallel_size * p.virtual_pipeline_size,
                      *_set_counts(p), p.pipeline_embedding_as_layer, p.pipeline_loss_as_layer)


def _accounted_error(cfg) -> Optional[ConfigError]:
    """The embedding/loss counted as a layer: an even split of the layers and the counted ends,
    not beside set counts, which say the same thing another way."""
    p = cfg.parallel
    field = "parallel.pipeline_embedding_as_layer" if p.pipeline_embedding_as_layer \
        else "parallel.pipeline_loss_as_layer"
    if any(_set_counts(p)):
        return ConfigError(field, True,
                           "false beside set parallel.pipeline_first_stage_layers / "
                           "pipeline_last_stage_layers, which fix the end stages' layers "
                           "themselves", "unset one of them")
    problem = accounted_problem(cfg.model.num_layers, p.pipeline_parallel_size,
                                p.virtual_pipeline_size, p.pipeline_embedding_as_layer,
                                p.pipeline_loss_as_layer)
    if problem:
        return ConfigError(field, True,
                           f"a split of model.num_layers={cfg.model.num_layers} over "
                           f"pipeline_parallel_size={p.pipeline_parallel_size} x "
                           f"virtual_pipeline_size={p.virtual_pipeline_size} that counts the "
                           f"ends: {problem}",
                           "change model.num_layers or the stages, or set it false")
    return None


def stages_error(cfg) -> Optional[ConfigError]:
    """Set first/last stage layer counts (config/stages.py): Megatron-LM's rule, and not beside
    a partition method they replace; or the ends counted as a layer (_accounted_error)."""
    p = cfg.parallel
    first, last = _set_counts(p)
    accounted = p.pipeline_embedding_as_layer or p.pipeline_loss_as_layer
    if first is None and last is None and not accounted:
        return None
    if accounted:
        error = _accounted_error(cfg)
        if error is not None:
            return error
        what = "the embedding or the loss counted as a layer"
    else:
        what = "set first/last stage layers"
        field = "parallel.pipeline_first_stage_layers" if first is not None \
            else "parallel.pipeline_last_stage_layers"
        problem = uneven_problem(cfg.model.num_layers, p.pipeline_parallel_size, first, last,
                                 p.virtual_pipeline_size)
        if problem:
            return ConfigError(field, first if first is not None else last,
                               f"a split of model.num_layers={cfg.model.num_layers} over "
                               f"pipeline_parallel_size={p.pipeline_parallel_size} stages that "
                               f"Megatron-LM's rule accepts: {problem}",
                               "change the counts (0: not set), or the stages")
    if p.pipeline_partition_method != "uniform":
        return ConfigError("parallel.pipeline_partition_method", p.pipeline_partition_method,
                           f"uniform (the default) with {what}, which replace the partition "
                           "method", "unset one of them")
    return None


def pipeline_stage_layers(cfg) -> Optional[List[int]]:
    """Transformer layers per stage (per model chunk, p x virtual_pipeline_size of them, with
    model chunks) when first/last counts are set or the ends counted as a layer (uneven
    stages), else None (the partition method splits them; model chunks split evenly)."""
    p = cfg.parallel
    first, last = _ends(cfg)
    if first is None and last is None:
        return None
    return stage_layers(cfg.model.num_layers, p.pipeline_parallel_size * p.virtual_pipeline_size,
                        first, last)


def check_pipeline(cfg) -> None:
    p = cfg.parallel
    counted = int(p.pipeline_embedding_as_layer) + int(p.pipeline_loss_as_layer)
    _raise(pipeline_error(cfg.model, p.pipeline_parallel_size, p.zero_stage, counted))
    _raise(stages_error(cfg))
    _raise(chunks_error(cfg))  # before the schedule's rule: it names virtual_pipeline_size
    _raise(schedule_error(p.pipeline_schedule, p.pipeline_parallel_size, p.context_parallel_size,
                          p.virtual_pipeline_size))
    if cfg.resilience.rerun_suspect_steps and cfg.parallel.pipeline_parallel_size > 1:
        raise ConfigError("resilience.rerun_suspect_steps", True,
                          "false under pipeline parallelism (DeepSpeed's pipeline engine runs "
                          "a step and its update as one call, so the update cannot wait)",
                          "set parallel.pipeline_parallel_size=1 or "
                          "resilience.rerun_suspect_steps=false")


def experts_error(m, tp: int, cp: int, stage: int, ep: int, zero: int, precision: str,
                  sequence_parallel: bool) -> Optional[ConfigError]:
    """What check_experts adds to moe_error once the world is known (the planner prices only
    layouts this accepts): EP among the `stage` ranks of a pipeline stage, the sequence slice
    each TP rank routes, and ZeRO-0's 16-bit norm."""
    if not m.moe.num_experts:
        return None
    if stage % ep:
        return ConfigError("parallel.expert_parallel_size", ep,
                           f"a divisor of the {stage} ranks of a pipeline stage (data x "
                           "context x tensor parallel: experts are split over them)",
                           "launch a multiple of it as ranks or lower it")
    if tp > 1 and not sequence_parallel and (m.seq_length // cp) % tp:
        return ConfigError("model.seq_length", m.seq_length,
                           f"a multiple of tensor_parallel_size x context_parallel_size "
                           f"({tp} x {cp}) with mixture of experts: each TP rank routes its "
                           "slice of the sequence", "change model.seq_length, or set "
                           "parallel.sequence_parallel=true")
    if (ep > 1 or tp > 1) and zero == 0 and precision != "fp32":
        # DeepSpeed's 16-bit ZeRO-0 optimizers average per-rank gradient norms, wrong once
        # ranks hold different experts (engine/experts.py replaces only the fp32 clipping).
        return ConfigError("parallel.zero_stage", 0, f"1 or 2 with mixture of experts, "
                           f"expert_parallel_size={ep}, tensor_parallel_size={tp} and "
                           f"training.precision={precision}: ZeRO-0's 16-bit optimizers take "
                           "a wrong gradient norm over experts split over ranks",
                           "set parallel.zero_stage=1, or training.precision=fp32")
    return None


def expert_stages_error(m, tp: int, ep: int, held: Optional[List[List[int]]]
                        ) -> Optional[ConfigError]:
    """Every pipeline stage holds a MoE layer where the experts are split over ranks (EP > 1, or
    TP > 1: engine/experts.py). held: the transformer layers each stage holds (its contiguous
    run, or with model chunks the layers of all its chunks: config/stages.rank_layer_indices;
    one stage: None or one entry). A stage without one holds no expert parameter groups
    (engine/optimizer.py) where the others hold them, and DeepSpeed's ZeRO gradient norm, one
    all-reduce a group over the pipeline, then waits forever (measured: MoE every 4th layer of
    4 on PP 2 with EP 2 hung at the first step)."""
    if not m.moe.num_experts or (ep == 1 and tp == 1) or not held or len(held) < 2:
        return None
    for stage, layers in enumerate(held):
        if not any(is_moe_layer(m, i) for i in layers):
            return ConfigError(
                "model.moe.layer_freq", m.moe.layer_freq,
                f"a frequency that puts a MoE layer on every pipeline stage while the experts "
                f"are split over ranks (expert_parallel_size={ep}, tensor_parallel_size={tp}): "
                f"stage {stage} holds {_layers_named(layers)}, none of them MoE (every "
                f"{m.moe.layer_freq}-th layer from layer 0 is), so its optimizer would hold no "
                "expert parameter group where the other stages do, and DeepSpeed's ZeRO "
                "gradient norm (one all-reduce a group over the pipeline) would hang",
                "lower model.moe.layer_freq, use fewer pipeline stages (or other model chunks: "
                "parallel.virtual_pipeline_size, parallel.pipeline_schedule), or set "
                "parallel.expert_parallel_size=1 and tensor_parallel_size=1")
    return None


def _layers_named(layers: List[int]) -> str:
    """'layers 2-5', 'layers 1, 3' (model chunks), 'layer 4' or 'no transformer layer'."""
    if not layers:
        return "no transformer layer"
    if len(layers) == 1:
        return f"layer {layers[0]}"
    if layers == list(range(layers[0], layers[-1] + 1)):
        return f"layers {layers[0]}-{layers[-1]}"
    return "layers " + ", ".join(map(str, layers))


def check_experts(cfg, world_size: int) -> None:
    """Mixture of experts: the layout (moe_error), experts_error and, under pipelining, a MoE
    layer on every stage (expert_stages_error; the uniform split, the set or counted end
    stages, or the model chunks each rank holds under interleaving and ZB-V: DeepSpeed's
    parameter-balanced split is not known here, so refused beside a MoE layer frequency above
    1)."""
    p, m = cfg.parallel, cfg.model
    ep, tp, cp = p.expert_parallel_size, p.tensor_parallel_size, p.context_parallel_size
    _raise(moe_error(m, tp, p.pipeline_parallel_size, cp, p.zero_stage, ep))
    _raise(experts_error(m, tp, cp, world_size // p.pipeline_parallel_size, ep, p.zero_stage,
                         cfg.training.precision, p.sequence_parallel))
    pp, chunks = p.pipeline_parallel_size, p.virtual_pipeline_size
    if pp == 1 or not m.moe.num_experts:
        return
    first, last = _ends(cfg)
    if chunks == 1 and first is None and last is None and \
            p.pipeline_partition_method != "uniform":
        if m.moe.layer_freq > 1 and (ep > 1 or tp > 1):
            raise ConfigError("parallel.pipeline_partition_method", p.pipeline_partition_method,
                              f"uniform with model.moe.layer_freq={m.moe.layer_freq} and the "
                              "experts split over ranks: every stage must hold a MoE layer, "
                              "which only a known split can be checked for",
                              "set parallel.pipeline_partition_method=uniform")
        return
    v_shape = schedules.get(p.pipeline_schedule).head_on_first
    _raise(expert_stages_error(m, tp, ep, rank_layer_indices(m.num_layers, pp, chunks, v_shape,
                                                             first, last)))


def grad_accum_error(precision: str, zero: int, experts: int) -> Optional[ConfigError]:
    """fp32 gradient accumulation is DeepSpeed's BF16_Optimizer, which it selects for bf16
    weights at ZeRO-1 only (ZeRO-0 without a pipeline raises in DeepSpeed; ZeRO-2/3 keep the
    model's dtype); its gradient norm is not the experts-aware one engine/experts.py installs."""
    fix = "set training.grad_accum_dtype=model"
    if precision != "bf16":
        return ConfigError("training.grad_accum_dtype", "fp32", f"model with training.precision="
                           f"{precision} (fp32 accumulation is for bf16 weights)",
                           f"{fix}, or training.precision=bf16")
    if zero != 1:
        return ConfigError("training.grad_accum_dtype", "fp32", f"model with parallel.zero_stage="
                           f"{zero}: DeepSpeed accumulates bf16 weights' gradients in fp32 (its "
                           "BF16_Optimizer) at ZeRO stage 1 only", f"{fix}, or "
                           "parallel.zero_stage=1")
    if experts:
        return ConfigError("training.grad_accum_dtype", "fp32", "model with mixture of experts "
                           f"(model.moe.num_experts={experts}): BF16_Optimizer's gradient norm "
                           "does not know experts split over ranks", fix)
    return None


def check_grad_accum(cfg) -> None:
    if cfg.training.grad_accum_dtype == "fp32":
        _raise(grad_accum_error(cfg.training.precision, cfg.parallel.zero_stage,
                                cfg.model.moe.num_experts or 0))


def check_batch(cfg, world_size: int) -> None:
    dp = data_parallel_size(cfg, world_size)
    mb, gb = cfg.training.micro_batch_size, cfg.training.global_batch_size
    if gb % (mb * dp):
        raise ConfigError("training.global_batch_size", gb,
                          f"a multiple of micro_batch_size x data-parallel size "
                          f"({mb} x {dp} = {mb * dp})")
    _raise(ramp_error(cfg, dp))


def ramp_error(cfg, dp: int) -> Optional[ConfigError]:
    """Every batch on training.rampup_batch_size's ramp splits into micro-batches over the
    data-parallel ranks, and the pipeline schedule runs that many micro-batches."""
    t, p = cfg.training, cfg.parallel
    return ramp_layout_error(t.rampup_batch_size, t.global_batch_size, t.micro_batch_size, dp,
                             p.pipeline_schedule, p.pipeline_parallel_size,
                             p.virtual_pipeline_size, p.pipeline_microbatch_group)


def ramp_layout_error(ramp: Optional[List[int]], global_batch: int, mb: int, dp: int,
                      schedule: str, pp: int, virtual: int, group: Optional[int]
                      ) -> Optional[ConfigError]:
    """ramp_error for one layout (megatron-plan's too): the ramp to global_batch."""
    if ramp is None:
        return None
    if ramp[0] % (mb * dp) or ramp[1] % (mb * dp):
        return ConfigError("training.rampup_batch_size", ramp,
                           f"a start and an increment that are multiples of micro_batch_size x "
                           f"data-parallel size ({mb} x {dp} = {mb * dp}): each step's batch "
                           "is whole micro-batches on every data-parallel rank")
    for size in ramp_sizes(ramp, global_batch)[:-1]:
        error = micro_batch_rule(schedule, pp, virtual, mb, dp, size, group)
        if error is not None:
            return ConfigError("training.rampup_batch_size", ramp,
                               f"batches on the ramp that the pipeline schedule runs; at "
                               f"{size} samples: {error.expected}",
                               f"make the start and the increment multiples of micro_batch_size "
                               f"x data-parallel size x pipeline_parallel_size = {mb * dp * pp}")
    return None


def check_deepspeed(cfg) -> None:
    p = cfg.parallel
    _raise(deepspeed_error(cfg.deepspeed, p.pipeline_parallel_size,
                           p.sequence_parallel and p.tensor_parallel_size > 1))


def lr_schedule_error(o, t) -> Optional[ConfigError]:
    """wsd's decay must fit between the warm-up and the decay's end (t: the training section),
    in steps or, where the schedule counts them, in samples."""
    if o.lr_decay_style != "wsd":
        return None
    samples = counts_samples(o)
    unit = "samples" if samples else "iters"
    warmup, end, wsd = schedule_lengths(o, t.total_samples() if samples else t.train_iters)
    if getattr(o, f"lr_decay_{unit}") is not None:
        source = f"optimizer.lr_decay_{unit}"
    else:
        source = ("training.train_samples" if samples and t.train_samples else
                  f"the samples of training.train_iters={t.train_iters} steps" if samples
                  else "training.train_iters")
    if wsd > end - warmup:
        return ConfigError(f"optimizer.lr_wsd_decay_{unit}", wsd,
                           f"at most the decay's end ({source}={end}) minus "
                           f"optimizer.lr_warmup_{unit}={warmup}, "
                           f"{end - warmup}: the decay begins after the warm-up",
                           f"shorten optimizer.lr_wsd_decay_{unit} or the warm-up, or train "
                           "longer")
    return None


def validate_for_world(cfg, world_size: int) -> int:
    """Runs every cross-section check; returns the derived data-parallel size."""
    check_world(cfg, world_size)
    check_tensor_parallel(cfg)
    check_context_parallel(cfg)
    check_pipeline(cfg)
    check_deepspeed(cfg)
    check_experts(cfg, world_size)
    check_grad_accum(cfg)
    check_batch(cfg, world_size)
    _raise(lr_schedule_error(cfg.optimizer, cfg.training))
    _raise(interleaving_error(cfg, data_parallel_size(cfg, world_size)))
    return data_parallel_size(cfg, world_size)


def check_device(cfg, device_type: str) -> None:
    """Checks that depend on the device found at startup."""
    if cfg.training.precision == "fp16" and device_type == "cpu":
        raise ConfigError("training.precision", "fp16",
                          "fp32 or bf16 on the CPU (DeepSpeed's CPU accelerator has no fp16)",
                          "use training.precision=bf16, or run on a GPU")
