"""The subcommands of megatron-plan: argument objects in, text and files out."""
from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Optional

from megatron.base.outputs import check_files, write_text_whole, write_whole
from megatron.cli.plan import MAX_NODES
from megatron.cli.plan_args import (layout_from_args, layout_overrides, load_job, load_space,
                                    overridden_flags, profile_from_args)
from megatron.config import Config, schedules
from megatron.config.errors import ConfigError, InputError
from megatron.planner import breakdown, emit, jobs, longest, ranges, scaling
from megatron.planner.jobs import ints
from megatron.planner.layout import Job, chunks_note, run_as
from megatron.planner.memory import GIB, memory_per_stage
from megatron.planner.params import active_params, model_params
from megatron.planner.profile import Profile
from megatron.planner.search import search
from megatron.planner.timing import step_time


def _check_nodes(nodes: int) -> None:
    if nodes < 1:
        raise ConfigError("--nodes", nodes, "a positive integer")


PLOT_FORMATS = (".png", ".pdf", ".svg")


def _check_plot(path: str) -> None:
    if path and os.path.splitext(path)[1].lower() not in PLOT_FORMATS:
        raise ConfigError("--plot", path, f"a file ending in {', '.join(PLOT_FORMATS)} (the "
                          "format is taken from it)", "add the extension, e.g. "
                          f"{os.path.splitext(path)[0]}.png")
    check_files(("--plot", path))


def _describe(job: Job, prof: Profile, nodes: int) -> str:
    m, s = job.model, prof.spec
    active = (f", {active_params(m) / 1e9:.2f}B active ({m.moe.num_experts} experts, top "
              f"{m.moe.top_k})" if m.moe.num_experts else "")
    grads = f" ({job.grad_dtype} gradients)" if job.grad_dtype else ""
    if job.fp8:
        grads += (f", FP8 matrix multiplies ({s.fp8_tflops:g} TFLOPs peak"
                  f"{', FP8 weights' if job.fp8_params else ''}; priced only)")
    return (f"model: {model_params(m) / 1e9:.2f}B parameters{active} ({m.num_layers} layers, "
            f"hidden {m.hidden_size}, {m.num_attention_heads} heads, seq {m.seq_length}), "
            f"global batch {job.global_batch}, {job.precision}{grads}\ncluster: {s.name}, "
            f"{nodes} node(s) x {s.gpus_per_node} = {nodes * s.gpus_per_node} devices of "
            f"{s.gpu_memory_gb:g} GB, {s.matmul_tflops(job.precision):g} TFLOPs peak")


# the search-space flags that name what an engine may not run (layout.engine_run_problem,
# memory.engine_problem): where the command line gives one, search says what it left out
ENGINE_AXES = ("--zero-stages", "--schedules", "--recompute-values", "--cp-values",
               "--cp-algos", "--interleave-values")


def _asked(args, flags) -> bool:
    """Whether the command line gave any of `flags` (megatron-plan's main records them)."""
    return any(f in getattr(args, "given_flags", ()) for f in flags)


def cmd_search(args) -> int:
    job, cfg, preset = load_job(args)
    prof = profile_from_args(args, cfg)
    _check_nodes(args.nodes)
    if job.fp8 and (args.out_config or args.out_sbatch):
        raise InputError("--out-config/--out-sbatch with --fp8: this trainer has no FP8, so no "
                         "config of it runs the priced layout; search without --fp8 to write one")
    check_files(("--out-config", args.out_config), ("--out-sbatch", args.out_sbatch))
    result = search(job, args.nodes, prof, load_space(args))
    if not result.ranked:  # its one message alone
        raise InputError(result.explain_empty())
    print(_describe(job, prof, args.nodes))
    note = result.unrunnable_note()
    if note and _asked(args, ENGINE_AXES):
        print(note)
    print(f"{result.enumerated} layouts enumerated, {len(result.ranked)} fit; fastest first:\n")
    print(emit.format_table(emit.HEADER, emit.table_rows(result.ranked[:args.top])))
    best = result.best
    print(f"\nrank 1's step: {best.time.step_s:.3g} s, "
          f"{_range(job, best.layout, prof, False).describe()}")
    _print_device_note(prof, best.layout.world)
    _print_notes(ranges.margin_note(best.memory.reserved_gb, prof.spec.gpu_memory_gb,
                                    "rank 1 is reserved"))
    print(ranges.ORDER_EVIDENCE)
    if not preset:
        print(_config_layout_rank(args, job, cfg, result, prof))
    best = _runnable_best(result, cfg, job)
    if args.out_config:
        run_dir = args.run_dir or f"runs/{os.path.splitext(os.path.basename(args.out_config))[0]}"
        best_cfg = emit.layout_config(cfg, job, best.layout, run_dir=run_dir,
                                      paper_optimizer=preset)
        write_text_whole(args.out_config, "the config",
                         emit.config_yaml(best_cfg, best, prof.spec.name, args.nodes))
        print(f"\nwrote {args.out_config}")
    if args.out_sbatch:
        config_path = args.out_config or "best.yaml"
        write_text_whole(args.out_sbatch, "the sbatch script", emit.sbatch_script(
            prof.spec, args.nodes, config_path, step_s=best.time.step_s if best.time else None,
            schedule=best.layout.schedule if best.layout.pp > 1 else None))
        print(f"wrote {args.out_sbatch} (runs {config_path})")
    return 0


def _runnable_best(result, cfg, job):
    """The best layout the trainer accepts (emit.layout_config validates each as the trainer
    would), with a note where a faster one ranks above it and why it is refused."""
    from megatron.config.errors import ConfigError
    best = result.best
    for cand in result.ranked:
        try:
            emit.layout_config(cfg, job, cand.layout)
        except ConfigError as e:
            if cand is best:
                why = str(e)
            continue
        if cand is not best:
            print(f"\nrank 1 ({best.layout.key()}) is {cand.time.step_s / best.time.step_s - 1:.1%} "
                  f"faster than the best layout the trainer accepts ({cand.layout.key()}), "
                  f"but the trainer refuses it: {why}; --out-config writes the accepted one")
        return cand
    return best


def _layout_source(args, cfg: Optional[Config]) -> str:
    if cfg is None:
        return ""
    overridden = overridden_flags(args, cfg)
    note = f" (from {args.config}"
    return note + (f"; {', '.join(overridden)} from the command line)" if overridden else ")")


def _config_layout_rank(args, job: Job, cfg: Config, result, prof: Profile) -> str:
    """Where the layout the config sets stands among the ranked ones, and what puts it behind
    the best."""
    try:
        # search's own --flash/--sequence-parallel name spaces to search, not a layout
        lay = layout_from_args(argparse.Namespace(), job, result.world, cfg, prof.spec.framework)
    except ConfigError as e:
        return f"\nthe layout {args.config} sets is not valid on {result.world} devices: {e}"
    keys = [c.layout for c in result.ranked]
    if lay in keys:
        i = keys.index(lay)
        t = result.ranked[i].time
        line = (f"\nthe layout {args.config} sets, {lay.key()}, ranks {i + 1} of {len(keys)}: "
                f"{t.step_s:.3g} s per step, {t.tflops_per_gpu:.3g} TFLOPs per GPU")
        return line + (_gap_note(job, lay, keys[0], prof) if i else "")
    return (f"\nthe layout {args.config} sets, {lay.key()}, is not among the {len(keys)} that "
            "fit (outside the search space, or over the device memory: see megatron-plan memory)")


def _gap_note(job: Job, lay, best, prof: Profile) -> str:
    """Why `lay` is behind `best`: the step terms that differ the most (planner/breakdown.py)."""
    slow, fast = breakdown.step_breakdown(job, lay, prof), breakdown.step_breakdown(job, best, prof)
    return (f"\nits step is {100 * (slow.step_s / fast.step_s - 1):.1f}% longer than the best's "
            f"({best.key()}); the terms that differ most: {breakdown.explain_gap(slow, fast)}")


def cmd_memory(args) -> int:
    job, cfg, preset = load_job(args)
    prof = profile_from_args(args, cfg)
    _check_nodes(args.nodes)
    cfg = None if preset else cfg
    lay = layout_from_args(args, job, args.nodes * prof.spec.gpus_per_node, cfg,
                           prof.spec.framework)
    # priced before anything is printed: a layout the engine refuses (its ZeRO stage, a
    # gradient dtype) gets its one message alone
    stages = memory_per_stage(job, lay, prof.constants, framework=prof.spec.framework)
    print(_describe(job, prof, args.nodes))
    print(f"layout: {lay.key()}{_layout_source(args, cfg)}")
    if lay.pp > 1:
        print(f"schedule priced: {run_as(lay)} ({schedules.get(run_as(lay)).priced})")
    if lay.interleave > 1:
        print(f"schedule: {chunks_note(lay)}")
    print()
    shown = stages if len(stages) <= 4 else [stages[0], stages[1], stages[-1]]
    header = ("stage", "params M", "weights", "grads", "optimizer", "activations", "working",
              "step extra", "bucket", "peak GB", "reserved GB")
    rows = [[str(s.stage), f"{s.params / 1e6:.1f}", *(f"{v / GIB:.2f}" for v in (
        s.weights, s.grads, s.optimizer, s.activations, s.working, s.step_transient, s.bucket)),
        f"{s.peak_gb:.2f}", f"{s.reserved_gb:.2f}"] for s in shown]
    print(emit.format_table(header, rows))
    worst = max(stages, key=lambda s: s.reserved_bytes)
    fits = worst.reserved_bytes <= prof.spec.gpu_memory_gb * GIB
    print(f"\nbusiest stage {worst.stage}: {worst.peak_gb:.1f} GB allocated at peak, "
          f"{worst.reserved_gb:.1f} GB reserved of {prof.spec.gpu_memory_gb:g} GB: "
          f"{'fits' if fits else 'DOES NOT FIT'}")
    smi = ranges.smi_note(worst.peak_gb, prof.spec.gpu_memory_gb, prof.spec.framework)
    _print_notes(ranges.margin_note(worst.reserved_gb, prof.spec.gpu_memory_gb),
                 smi if fits else "")
    t = step_time(job, lay, prof)
    print(f"step {t.step_s:.3g} s (pipeline {t.pipeline_s:.3g} s, gradient reduction + optimizer "
          f"{t.reduce_s:.3g} s), {t.tokens_per_s:.4g} tokens/s, {t.tflops_per_gpu:.1f} TFLOPs "
          f"per GPU = {100 * t.mfu:.1f}% of {'the 16-bit ' if job.fp8 else ''}peak (with "
          f"recompute {100 * t.hfu:.1f}%), bubble "
          f"{100 * t.bubble:.1f}%")
    print("\nwhere the step goes (the slowest stage's slots, the reduction of the stage that "
          "reduces the most):")
    print(emit.format_table(breakdown.HEADER, breakdown.table_rows(
        breakdown.step_breakdown(job, lay, prof))))
    free = args.micro_batch is None and cfg is None
    print(f"\npredicted step {_range(job, lay, prof, free).describe()}")
    _print_device_note(prof, lay.world)
    if free:
        lo, hi, mbs = ranges.memory_range(job, lay, prof)
        print(f"micro-batch not given: {lay.micro_batch} priced; over those that fit "
              f"({', '.join(map(str, mbs))}) {lo / GIB:.1f}-{hi / GIB:.1f} GB reserved")
    return 0


def _print_device_note(prof: Profile, devices: int) -> None:
    """The lines beside the error band on a preset or an engine the published runs do not
    cover, and for a layout as large as the largest published runs."""
    _print_notes(ranges.device_note(prof.spec.name), ranges.engine_note(prof.spec.framework),
                 ranges.scale_note(devices))


def _print_notes(*notes: str) -> None:
    """Each note that is not empty, a line each (ranges' notes are "" where they do not apply)."""
    for note in notes:
        if note:
            print(note)


def _range(job: Job, lay, prof: Profile, free_micro_batch: bool) -> ranges.Range:
    """The step's range over what the user did not fix, and around it the time model's own
    held-out error (planner/ranges.py)."""
    return ranges.step_range(job, lay, prof, lambda j, l, p: step_time(j, l, p).step_s,
                             free_micro_batch=free_micro_batch, model_error=ranges.MODEL_ERROR)


def cmd_scaling(args) -> int:
    job, cfg, preset = load_job(args)
    prof = profile_from_args(args, cfg)
    cfg = None if preset else cfg
    _check_plot(args.plot)
    nodes = ints("--nodes", args.nodes)
    if min(nodes) < 1 or max(nodes) > MAX_NODES:
        raise ConfigError("--nodes", args.nodes, f"node counts from 1 to {MAX_NODES:,}, e.g. "
                          "16,32,64")
    smallest = min(nodes)
    if args.best:
        names = {name for name, value in layout_overrides(args).items() if value is not None}
        # as typed (--no-sp for sp), else by their field names
        given = ([f for f in getattr(args, "given_flags", ())
                  if f[2:].replace("-", "_").removeprefix("no_") in names]
                 or sorted(f"--{name.replace('_', '-')}" for name in names))
        if given:
            raise InputError(f"scaling --best searches the layout at {smallest} node(s) itself, "
                             f"so {', '.join(given)} would be ignored: drop "
                             f"{'them' if len(given) > 1 else 'it'}, or drop --best to project "
                             "the layout they set")
        base = search(job, smallest, prof).best.layout
    else:
        base = layout_from_args(args, job, smallest * prof.spec.gpus_per_node, cfg,
                                prof.spec.framework)
    modes = ("weak", "strong") if args.mode == "both" else (args.mode,)
    points = [p for mode in modes for p in scaling.project(job, base, prof, nodes, mode)]
    print(_describe(job, prof, smallest))
    source = "" if args.best else _layout_source(args, cfg)
    print(f"layout at {smallest} node(s): {base.key()}{source}; DP grows with the nodes")
    if base.interleave > 1:
        print(f"schedule: {chunks_note(base)}")
    print()
    print(emit.format_table(scaling.HEADER, scaling.table_rows(points)))
    # how sure: the device's and engine's evidence, the largest count's scale, and the memory
    # of the tightest point that fits (the notes memory and search print)
    priced = [p for p in points if p.layout is not None]
    _print_device_note(prof, max((p.gpus for p in priced), default=0))
    _print_notes(ranges.margin_note(max((p.memory_share for p in priced
                                         if p.memory_share <= 1), default=0.0), 1.0,
                                    "the layout is reserved",
                                    "a smaller --micro-batch, --recompute or more --tp, --pp or "
                                    "--zero leaves more room"))
    if args.plot:
        title = (f"{model_params(job.model) / 1e9:.0f}B on {prof.spec.name}: TP{base.tp} x "
                 f"PP{base.pp}, micro-batch {base.micro_batch}")
        write_whole(args.plot, "the plot", lambda tmp: scaling.plot(points, tmp, title))
        print(f"\nwrote {args.plot}")
    return 0


def cmd_longest(args) -> int:
    job, _, _ = load_job(args)
    prof = profile_from_args(args)
    _check_nodes(args.nodes)
    if args.step < 1:
        raise ConfigError("--step", args.step, "a positive number of tokens")
    given = jobs.search_space(cp_values=args.cp_values, cp_algos=args.cp_algos,
                              memory_fraction=args.memory_fraction)
    space = dataclasses.replace(longest.LEAST_MEMORY, cp=given.cp, cp_algos=given.cp_algos,
                                memory_fraction=given.memory_fraction)
    result = longest.longest_sequence(job, args.nodes, prof, space, args.step)
    if not result.seq:  # its one message alone
        raise InputError(f"no layout of {args.nodes} node(s) fits even {args.step} tokens: "
                         "add nodes")
    print(_describe(job, prof, args.nodes))
    print("searched: micro-batch 1, full recompute, FlashAttention, ZeRO 1-3, SP on and off, "
          f"{', '.join(space.schedules)}, context parallel {args.cp_values} "
          f"({', '.join(space.cp_algos)}); lengths in "
          f"multiples of {args.step}")
    best = result.ranked[0]
    cap = (f" ({result.first_fail} does not)" if result.first_fail
           else " (the largest length tried)")
    print(f"\nlongest sequence: {result.seq} tokens{cap}, predicted; "
          f"{len(result.ranked)} layout(s) fit at it; the fastest: {best.layout.key()}, "
          f"{best.memory.peak_gb:.1f} GB allocated, {best.memory.reserved_gb:.1f} GB reserved "
          f"of {prof.spec.gpu_memory_gb:g}\n")
    print(emit.format_table(emit.HEADER, emit.table_rows(result.ranked[:args.top])))
    _print_notes(ranges.margin_note(best.memory.reserved_gb, prof.spec.gpu_memory_gb,
                                    "the fastest is reserved"))
    return 0


def cmd_calibrate(args) -> int:
    if getattr(args, "fp8", False) or getattr(args, "fp8_params", False):
        raise InputError("calibrate runs this trainer, which has no FP8: drop --fp8 and "
                         "--fp8-params (they price other engines' FP8 in search and memory)")
    from megatron.cli.plan_calibrate import run_calibrate  # torch and optuna load only here
    return run_calibrate(args)


COMMANDS = {"search": cmd_search, "memory": cmd_memory, "scaling": cmd_scaling,
            "calibrate": cmd_calibrate, "longest": cmd_longest}
