"""megatron-plan's flags as calls into the planner library (megatron/planner/jobs.py): the one
place the subcommands (plan_commands.py, plan_calibrate.py) read argparse namespaces from."""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

from megatron.config import Config
from megatron.config.errors import InputError
from megatron.planner import jobs
from megatron.planner.fp8 import cluster_problem
from megatron.planner.hardware import PRESET_NAMES
from megatron.planner.layout import Job, Layout
from megatron.planner.profile import Profile, load_profile
from megatron.planner.search import SearchSpace

_LAYOUT_FLAGS = ("tp", "pp", "micro_batch", "zero", "recompute", "flash", "sp", "interleave",
                 "schedule", "cp", "first_stage_layers", "last_stage_layers",
                 "ep", "cp_algo", "ulysses_degree", "embedding_as_layer", "loss_as_layer",
                 "microbatch_group")


def load_job(args) -> Tuple[Job, Config, bool]:
    job, cfg, preset = jobs.load_job(args.model, args.config, args.set, args.global_batch,
                                     args.seq_length, args.precision)
    job = jobs.with_grad_dtype(job, getattr(args, "grad_dtype", None))
    job = jobs.with_fp8(job, getattr(args, "fp8", False), getattr(args, "fp8_params", False))
    return job, cfg, preset


def load_space(args) -> SearchSpace:
    return jobs.search_space(args.tp_values, args.pp_values, args.micro_batches,
                             args.zero_stages, args.recompute_values, args.flash,
                             args.sequence_parallel, args.max_tp, args.memory_fraction,
                             args.schedules, getattr(args, "cp_values", "1"),
                             getattr(args, "ep_values", "1"),
                             getattr(args, "cp_algos", "ulysses"),
                             getattr(args, "interleave_values", "1"),
                             getattr(args, "lighter_ends", "0"))


def layout_overrides(args) -> dict:
    return {name: getattr(args, name, None) for name in _LAYOUT_FLAGS}


def layout_from_args(args, job: Job, world: int, cfg: Optional[Config] = None,
                     framework: str = "deepspeed") -> Layout:
    values, _ = jobs.layout_values(layout_overrides(args), cfg)
    return jobs.layout_for(job, world, values, framework)


def overridden_flags(args, cfg: Optional[Config]) -> List[str]:
    """The flags that replace a layout value --config FILE sets."""
    _, replaced = jobs.layout_values(layout_overrides(args), cfg)
    return [f"--{name.replace('_', '-')}" for name in replaced]


def profile_from_args(args, cfg: Optional[Config] = None) -> Profile:
    """The --cluster profile under --framework; a config with parallel.tp_backward_overlap
    false runs this trainer (deepspeed) with every TP collective exposed: megatron-deepspeed's
    pricing."""
    if not args.cluster:
        raise InputError(f"name the cluster: --cluster PRESET ({PRESET_NAMES}) or --cluster "
                         "FILE.yaml (docs/planner.md); there is no default")
    prof = load_profile(args.cluster)
    problem = cluster_problem(prof.spec) if getattr(args, "fp8", False) else None
    if problem:
        raise InputError(problem)
    framework = getattr(args, "framework", None)
    if framework and framework != prof.spec.framework:
        prof = dataclasses.replace(prof, spec=dataclasses.replace(prof.spec, framework=framework))
    if cfg is not None and not cfg.parallel.tp_backward_overlap and \
            prof.spec.framework == "deepspeed":
        prof = dataclasses.replace(prof, spec=dataclasses.replace(
            prof.spec, framework="megatron-deepspeed"))
    return prof
