"""The rules of interleaved pipelines (parallel.virtual_pipeline_size = v > 1, run by the
interleaved schedule, config/schedules/interleaved.py): checked with the other cross-section
rules before any rendezvous or allocation (validate.validate_for_world). Torch-free."""
from __future__ import annotations

from typing import Optional

from megatron.config import schedules
from megatron.config.errors import ConfigError

# the runner ids of the schedules that hold several chunks per rank (engine/runners.py):
# interleaved 1F1B's loop of chunks, and ZB-V's V
INTERLEAVED = "virtual_stages"
CHUNKED = (INTERLEAVED, "v_stages")


def chunks_error(cfg) -> Optional[ConfigError]:
    """v > 1 needs stages, the schedule that holds several chunks per rank, and layers that
    split into p v equal chunks (the embedding rides on chunk 0, the head on the last), or set
    first/last chunk layers or the ends counted as a layer (config/stages.py) with the rest
    even."""
    p = cfg.parallel
    uneven = bool(p.pipeline_first_stage_layers or p.pipeline_last_stage_layers
                  or p.pipeline_embedding_as_layer or p.pipeline_loss_as_layer)
    return chunk_rule(cfg.model.num_layers, p.pipeline_parallel_size, p.context_parallel_size,
                      p.virtual_pipeline_size, p.pipeline_schedule, uneven)


def chunk_rule(num_layers: int, pp: int, cp: int, v: int, schedule: str,
               uneven: bool) -> Optional[ConfigError]:
    """chunks_error's rule on plain values, the one the planner applies to its layouts
    (planner/layout.interleave_problem): v chunks per stage of pp stages under `schedule`."""
    if v == 1:
        return None
    if pp == 1:
        return ConfigError("parallel.virtual_pipeline_size", v,
                           "1 without pipeline parallelism (pipeline_parallel_size=1): model "
                           "chunks are spread over pipeline ranks",
                           "set parallel.pipeline_parallel_size>1 or "
                           "parallel.virtual_pipeline_size=1")
    record = schedules.get(schedule)
    if record.runner not in CHUNKED:
        return ConfigError("parallel.virtual_pipeline_size", v,
                           f"1 with parallel.pipeline_schedule={schedule}: only the "
                           "interleaved and zbv schedules hold several model chunks per rank "
                           "(DeepSpeed's pipeline engine, which runs 1f1b and zbh1, holds one "
                           "stage; zbh1 is not interleaved in this trainer)",
                           "set parallel.pipeline_schedule=interleaved, or "
                           "parallel.virtual_pipeline_size=1")
    # the schedule's own chunk count first (ZB-V: exactly 2), then the layers per chunk
    own = record.rule(pp, cp, v)
    if own is not None:
        return own
    if num_layers % (pp * v) and not uneven:  # set counts: validate.stages_error's rule
        return _layers_error(num_layers, pp, v)
    return None


def _layers_error(layers: int, pp: int, v: int) -> ConfigError:
    """v must divide each stage's layers: every model chunk holds the same number of layers."""
    if layers % pp:
        why = f"{layers} layers do not split evenly over {pp} stages"
    else:
        why = (f"each of the {pp} stages holds {layers // pp} layers, which "
               f"virtual_pipeline_size={v} does not split into equal model chunks")
    fits = [c for c in range(2, layers // pp + 1) if (layers // pp) % c == 0]
    other = (f", or parallel.virtual_pipeline_size to one of {', '.join(map(str, fits))}"
             if fits and not layers % pp else ", or lower parallel.virtual_pipeline_size")
    return ConfigError("model.num_layers", layers,
                       f"a multiple of pipeline_parallel_size x virtual_pipeline_size = {pp} x "
                       f"{v} = {pp * v} ({why})",
                       f"set model.num_layers to a multiple of {pp * v}{other}")


def micro_batches_error(cfg, dp: int) -> Optional[ConfigError]:
    """Megatron's rule for its interleaved order: the micro-batches of a step come in groups
    (parallel.pipeline_microbatch_group, by default p), each group passing every chunk of a rank
    in turn."""
    p, t = cfg.parallel, cfg.training
    return micro_batch_rule(p.pipeline_schedule, p.pipeline_parallel_size,
                            p.virtual_pipeline_size, t.micro_batch_size, dp, t.global_batch_size,
                            p.pipeline_microbatch_group)


def group_fits(pp: int, m: int, group: int) -> bool:
    """Whether m micro-batches run in groups of `group` on pp stages without a dependency
    bubble (Megatron Core's rule): pp <= group <= m, and a last, smaller group of at least pp."""
    return pp <= group <= m and (m % group == 0 or m % group >= pp)


def fitting_group(pp: int, m: int) -> int:
    """The smallest group that runs m micro-batches on pp stages (the least held in the
    warm-up), 0 where none does (m < pp)."""
    return next((g for g in range(pp, m + 1) if group_fits(pp, m, g)), 0)


def micro_batch_rule(schedule: str, pp: int, v: int, mb: int, dp: int, gb: int,
                     group: int = 0) -> Optional[ConfigError]:
    """micro_batches_error's rule on plain values (the planner's too): under the interleaved
    order, global_batch_size / (mb x dp) micro-batches that groups of `group` (0: pp) take
    (group_fits); ZB-V's order takes any."""
    if v == 1 or pp == 1:
        if group:
            return ConfigError("parallel.pipeline_microbatch_group", group,
                               "0 without model chunks (virtual_pipeline_size=1 or "
                               "pipeline_parallel_size=1): groups order the passes of chunks",
                               "set parallel.pipeline_microbatch_group=0")
        return None
    if schedules.get(schedule).runner != INTERLEAVED:  # ZB-V's order takes any m
        if group:
            return ConfigError("parallel.pipeline_microbatch_group", group,
                               f"0 with parallel.pipeline_schedule={schedule}: only the "
                               "interleaved order runs micro-batches in groups",
                               "set parallel.pipeline_microbatch_group=0")
        return None
    m = gb // (mb * dp)
    if group_fits(pp, m, group or pp):
        return None
    fit = fitting_group(pp, m)
    how = (f"set parallel.pipeline_microbatch_group={fit}, or training.global_batch_size to a "
           f"multiple of {mb * dp * pp}" if fit else
           f"set training.global_batch_size to at least {mb * dp * pp}")
    if group:
        return ConfigError("parallel.pipeline_microbatch_group", group,
                           f"between parallel.pipeline_parallel_size={pp} and the {m} "
                           f"micro-batches a step (global_batch_size / (micro_batch_size x "
                           f"data-parallel size) = {gb} / ({mb} x {dp})), leaving a last "
                           f"group of 0 or at least {pp}", how)
    return ConfigError("training.global_batch_size", gb,
                       f"micro-batches per step, global_batch_size / (micro_batch_size x "
                       f"data-parallel size) = {gb} / ({mb} x {dp}) = {m}, a multiple of "
                       f"parallel.pipeline_parallel_size={pp} under interleaving (or of a "
                       "parallel.pipeline_microbatch_group that takes them)", how)


def scope_error(cfg) -> Optional[ConfigError]:
    """What the interleaved executor does not run yet: fp16 (its loss scaling across chunks is
    untried: DeepSpeed's CPU accelerator has no fp16, and no GPU was at hand) and ZeRO-0.
    Experts run (tests/distributed/test_model_moe.py; a MoE layer among every rank's chunks is
    validate.check_experts' rule). bf16 under ZeRO-1 is DeepSpeed's ZeRO optimizer with bf16
    weights, the same one 1f1b gets (tests/distributed/test_engine_interleaved.py)."""
    p, t = cfg.parallel, cfg.training
    if p.virtual_pipeline_size == 1 or p.pipeline_parallel_size == 1:
        return None
    if t.precision == "fp16":
        return ConfigError("training.precision", t.precision,
                           "fp32 or bf16 with parallel.virtual_pipeline_size > 1: the "
                           "interleaved executor's fp16 loss scaling is not tested yet",
                           "set training.precision=bf16 or fp32, or "
                           "parallel.virtual_pipeline_size=1")
    if p.zero_stage == 0:
        return ConfigError("parallel.zero_stage", 0,
                           "1 with parallel.virtual_pipeline_size > 1: under ZeRO-0 DeepSpeed "
                           "clips by a norm of the first pipeline stage's parameters only (its "
                           "pipeline grid's model-parallel rank 0), which interleaved chunks "
                           "cannot reproduce; ZeRO-1 takes the norm of every stage and runs "
                           "bit for bit as 1f1b", "set parallel.zero_stage=1")
    return None


def interleaving_error(cfg, dp: int) -> Optional[ConfigError]:
    return chunks_error(cfg) or micro_batches_error(cfg, dp) or scope_error(cfg)
