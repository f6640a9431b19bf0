"""What the planner is asked about: the job (a model preset or a training config), the layout a
config sets with explicit overrides, and the search space, from plain values.

megatron/cli/plan_args.py turns command-line flags into these calls; nothing here parses argv."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

from megatron.config import Config, load_config, variants
from megatron.config.errors import ConfigError, InputError, ascii_int
from megatron.config.schedules import DEFAULT, names, with_runner
from megatron.config.stages import set_or_none
from megatron.planner.fp8 import fp8_problem
from megatron.planner.grad_dtype import grad_dtype_problem
from megatron.planner.layout import RECOMPUTE, Job, Layout, check_layout
from megatron.planner.models import preset_model
from megatron.planner.search import SearchSpace

# The layout a job runs when neither a config nor an override sets a value.
LAYOUT_DEFAULTS = {"tp": 1, "pp": 1, "micro_batch": 1, "zero": 1, "recompute": "none",
                   "flash": True, "sp": False, "interleave": 1, "schedule": DEFAULT, "cp": 1,
                   "first_stage_layers": None, "last_stage_layers": None, "ep": 1,
                   "cp_algo": "ulysses", "ulysses_degree": 0, "embedding_as_layer": False,
                   "loss_as_layer": False, "microbatch_group": 0}


def load_job(model: Optional[str] = None, config: Optional[str] = None,
             overrides: Sequence[str] = (), global_batch: Optional[int] = None,
             seq_length: Optional[int] = None,
             precision: Optional[str] = None) -> Tuple[Job, Config, bool]:
    """(job, base config, whether the model is a preset) from a preset name or a config file
    (with --set style overrides); batch, sequence and precision override either."""
    if model and config:
        raise InputError("pass either --model PRESET or --config FILE, not both")
    if seq_length is not None and seq_length < 1:
        raise ConfigError("--seq-length", seq_length, "a positive number of tokens")
    if config:
        cfg = load_config(config, list(overrides))
        m = cfg.model
        if seq_length is not None:
            m = dataclasses.replace(m, seq_length=seq_length,
                                    max_position_embeddings=max(seq_length,
                                                                m.max_position_embeddings))
        t = cfg.training
        if global_batch is not None and t.rampup_batch_size is not None:
            # the ramp must reach the new batch: TrainingConfig's own check, naming the ramp
            t = dataclasses.replace(t, global_batch_size=global_batch)
        job = Job(m, t.global_batch_size if global_batch is None else global_batch,
                  precision or t.precision, deepspeed=cfg.deepspeed,
                  grad_accum=t.grad_accum_dtype,
                  ramp=tuple(t.rampup_batch_size) if t.rampup_batch_size else None)
        preset = False
    else:
        if overrides:
            raise InputError("--set overrides fields of --config FILE; pass a config file too")
        if not model:
            raise InputError("name the model: --model PRESET (22b, 175b, 1t, gpt3-...) or "
                             "--config FILE.yaml")
        job = Job(preset_model(model, 2048 if seq_length is None else seq_length),
                  1280 if global_batch is None else global_batch, precision or "bf16")
        cfg, preset = Config(), True
    if job.global_batch < 1:
        raise ConfigError("--global-batch", job.global_batch, "a positive integer")
    return job, cfg, preset


def with_grad_dtype(job: Job, grad_dtype: Optional[str]) -> Job:
    """job with its gradients held and reduced in grad_dtype (grad_dtype.py); None: as is."""
    problem = grad_dtype_problem(grad_dtype, job.precision)
    if problem:
        raise InputError(problem)
    return dataclasses.replace(job, grad_dtype=grad_dtype) if grad_dtype else job


def with_fp8(job: Job, fp8_gemms: bool, fp8_params: bool) -> Job:
    """job with FP8 matrix multiplies (fp8.py), and FP8 weights with fp8_params."""
    changed = dataclasses.replace(job, fp8=bool(fp8_gemms), fp8_params=bool(fp8_params))
    problem = fp8_problem(changed)
    if problem:
        raise InputError(problem)
    return changed


def config_layout(cfg: Config) -> Dict[str, object]:
    """The layout values a training config sets (an attention core whose record keeps the s x s
    scores is priced as the math path, any other as flash; parallel.pipeline_schedule is the
    schedule, virtual_pipeline_size the chunks per stage, pipeline_microbatch_group the
    interleaved order's groups, and the set or counted end stages their layers)."""
    p, t = cfg.parallel, cfg.training
    return {"tp": p.tensor_parallel_size, "pp": p.pipeline_parallel_size,
            "micro_batch": t.micro_batch_size, "zero": p.zero_stage,
            "recompute": t.activation_checkpointing,
            "flash": not variants.attention_of(cfg.model).keeps_scores,
            "sp": p.sequence_parallel,
            "schedule": p.pipeline_schedule, "cp": p.context_parallel_size,
            "ep": p.expert_parallel_size, "cp_algo": p.context_parallel_algo,
            "ulysses_degree": p.ulysses_degree, "interleave": p.virtual_pipeline_size,
            "first_stage_layers": set_or_none(p.pipeline_first_stage_layers),
            "last_stage_layers": set_or_none(p.pipeline_last_stage_layers),
            "embedding_as_layer": p.pipeline_embedding_as_layer,
            "loss_as_layer": p.pipeline_loss_as_layer,
            "microbatch_group": p.pipeline_microbatch_group}


def layout_values(overrides: Dict[str, object],
                  cfg: Optional[Config] = None) -> Tuple[Dict[str, object], List[str]]:
    """The layout `overrides` give (None: not given), completed from the config, then the
    defaults; and the names of the overrides that replace a value the config sets."""
    from_cfg = config_layout(cfg) if cfg is not None else {}
    values, replaced = {}, []
    for name, default in LAYOUT_DEFAULTS.items():
        given = overrides.get(name)
        if given is None:
            values[name] = from_cfg.get(name, default)
        else:
            values[name] = given
            if name in from_cfg and from_cfg[name] != given:
                replaced.append(name)
    return values, replaced


def layout_for(job: Job, world: int, values: Dict[str, object],
               framework: str = "deepspeed") -> Layout:
    """The Layout of `values` (layout_values) on `world` devices, checked as the trainer would
    (the interleaved schedule only by Megatron-LM's rules: the trainer cannot run it)."""
    tp, pp, mb, cp = values["tp"], values["pp"], values["micro_batch"], values.get("cp", 1)
    if tp < 1 or pp < 1 or mb < 1 or cp < 1:
        raise ConfigError("--tp/--pp/--micro-batch/--cp", (tp, pp, mb, cp), "positive integers")
    if world % (tp * pp * cp):
        raise ConfigError("--tp x --pp x --cp", tp * pp * cp, f"a divisor of the {world} devices")
    dp = world // (tp * pp * cp)
    if job.global_batch % (mb * dp):
        # the batch may be the config's or the preset's default: the fix is the same flag
        step = mb * dp
        lower = job.global_batch // step * step
        near = f"{lower + step}" + (f" or {lower}" if lower else "")
        raise ConfigError("--global-batch", job.global_batch,
                          f"a multiple of micro-batch x DP ({mb} x {dp})",
                          f"pass --global-batch {near}, or a layout whose micro-batch x DP "
                          "divides it")
    lay = Layout(tp, pp, dp, mb, job.global_batch // (mb * dp), values["zero"],
                 values["recompute"], values["flash"], values["sp"], values["interleave"],
                 values["schedule"], cp, values.get("first_stage_layers"),
                 values.get("last_stage_layers"), values.get("ep", 1),
                 values.get("cp_algo", "ulysses"), values.get("ulysses_degree", 0),
                 embedding_as_layer=bool(values.get("embedding_as_layer")),
                 loss_as_layer=bool(values.get("loss_as_layer")),
                 microbatch_group=values.get("microbatch_group") or 0)
    check_layout(job, lay, framework)
    return lay


def items(flag: str, text: str, expected: str) -> List[str]:
    """The comma-separated items of a list flag, stripped; an empty one ("1,,4", a trailing
    comma) is refused: it is most often a value typed short, which must not vanish."""
    parts = [v.strip() for v in text.split(",")]
    if "" in parts:
        raise ConfigError(flag, text, expected, "an item is empty: remove the extra comma or "
                          "type the value that belongs there")
    return parts


def ints(flag: str, text: str) -> List[int]:
    expected = "comma-separated integers, e.g. 1,2,4"
    parts = items(flag, text, expected)
    try:
        values = [ascii_int(v) for v in parts]
    except ValueError:
        raise ConfigError(flag, text, expected) from None
    if min(values) < 0:
        raise ConfigError(flag, text, "comma-separated non-negative integers, e.g. 1,2,4")
    return values


def _positive_ints(text: str, flag: str = "--cp-values") -> Tuple[int, ...]:
    values = ints(flag, text)
    if min(values) < 1:
        auto = "auto or " if flag in ("--cp-values", "--ep-values") else ""
        raise ConfigError(flag, text, f"{auto}comma-separated integers >= 1, e.g. 1,2,4")
    return tuple(values)


def _both(flag: str, value: str) -> Tuple[bool, ...]:
    choices = {"both": (True, False), "on": (True,), "off": (False,)}
    if value not in choices:
        raise ConfigError(flag, value, "both, on or off")
    return choices[value]


def search_space(tp_values: Optional[str] = None, pp_values: Optional[str] = None,
                 micro_batches: str = "1,2,4,8,16", zero_stages: str = "0,1,2,3",
                 recompute_values: str = "none,selective,full", flash: str = "both",
                 sequence_parallel: str = "both", max_tp: Optional[int] = None,
                 memory_fraction: float = 1.0, schedules: Optional[str] = None,
                 cp_values: str = "1", ep_values: str = "1",
                 cp_algos: str = "ulysses", interleave_values: str = "1",
                 lighter_ends: str = "0") -> SearchSpace:
    """A SearchSpace from the comma-separated lists the command line takes; cp_values "auto"
    tries every context-parallel degree the model allows (SearchSpace.cp = None);
    schedules None: every registered schedule the trainer runs (config/schedules.with_runner)."""
    recompute = tuple(items("--recompute-values", recompute_values, f"values among {RECOMPUTE}"))
    if any(v not in RECOMPUTE for v in recompute):
        raise ConfigError("--recompute-values", recompute_values, f"values among {RECOMPUTE}")
    zero = ints("--zero-stages", zero_stages)
    if any(z > 3 for z in zero):
        raise ConfigError("--zero-stages", zero_stages, "stages among 0,1,2,3")
    if schedules is None:
        schedule_values = with_runner()
    else:
        schedule_values = tuple(items("--schedules", schedules, f"values among {names()}"))
    if not schedule_values or any(v not in names() for v in schedule_values):
        raise ConfigError("--schedules", schedules, f"values among {names()}")
    if not 0 < memory_fraction <= 1:
        raise ConfigError("--memory-fraction", memory_fraction, "a share in (0, 1]")
    if max_tp is not None and max_tp < 1:
        raise ConfigError("--max-tp", max_tp, "a positive tensor-parallel size")
    return SearchSpace(tp=_positive_ints(tp_values, "--tp-values") if tp_values else None,
                       pp=_positive_ints(pp_values, "--pp-values") if pp_values else None,
                       micro_batch=_positive_ints(micro_batches, "--micro-batches"), zero=zero,
                       recompute=recompute, flash=_both("--flash", flash),
                       sequence_parallel=_both("--sequence-parallel", sequence_parallel),
                       max_tp=max_tp, memory_fraction=memory_fraction,
                       schedules=schedule_values,
                       cp=None if cp_values.strip() == "auto" else _positive_ints(cp_values),
                       ep=None if ep_values.strip() == "auto" else _positive_ints(ep_values,
                                                                                  "--ep-values"),
                       cp_algos=_cp_algos(cp_algos),
                       interleave=_positive_ints(interleave_values, "--interleave-values"),
                       lighter_ends=tuple(ints("--lighter-ends", lighter_ends)))


def _cp_algos(text: str) -> Tuple[str, ...]:
    """--cp-algos: "all" or a comma-separated list of parallel.context_parallel_algo values."""
    from megatron.config.context_parallel import ALGOS
    values = ALGOS if text.strip() == "all" else tuple(
        items("--cp-algos", text, f"all or values among {ALGOS}"))
    if not values or any(v not in ALGOS for v in values):
        raise ConfigError("--cp-algos", text, f"all or values among {ALGOS}")
    return values
