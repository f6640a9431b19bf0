"""Every path a run will read or write, checked at start-up before anything is allocated.

Without this a checkpoints folder that cannot be written is found at the first save, after
steps were trained, and a node-local tier or a TensorBoard folder later still (issue 41 item
8). The check creates nothing: a folder that does not exist yet must be creatable, that is its
nearest existing ancestor a writable directory. Writability is tried with a probe file, not
with permission bits: root passes every bit check but not a read-only mount or an immutable
(chattr +i) folder. Every rank checks (a node-local folder is per node); the first problem is
one InputError naming the field, the path, what was expected and the fix. Imports no torch, so
megatron-train runs it before its heavy imports."""
from __future__ import annotations

import os
from typing import Iterator, Optional, Sequence, Tuple

from megatron.base.outputs import check_output
from megatron.base.rundir import CONFIG, RunDir
from megatron.config import Config
from megatron.config.errors import InputError, unexpanded

Need = Tuple[str, str]  # (the field that names it, the path)


def writable_dirs(cfg: Config) -> Iterator[Need]:
    run = RunDir(cfg.run.dir)
    yield "run.dir", run.path
    # always: a stop signal or the job's deadline saves even a run without checkpoint.save
    yield "run.dir (its checkpoints folder)", run.checkpoints
    yield "run.dir (its hangs folder, for the hang watchdog)", run.hangs
    if cfg.training.tensorboard:
        yield "training.tensorboard (the run's TensorBoard folder)", run.tensorboard
    if cfg.run.wandb != "off":
        yield f"run.wandb={cfg.run.wandb} (W&B's folder)", run.wandb
    if cfg.checkpoint.save_local_dir:
        yield "checkpoint.save_local_dir", cfg.checkpoint.save_local_dir
    if cfg.data.cache_dir and not cfg.data.synthetic:
        yield "data.cache_dir", cfg.data.cache_dir


def readable_files(cfg: Config) -> Iterator[Need]:
    d = cfg.data
    if d.synthetic:
        return
    from megatron.data.blended_dataset import parse_paths  # numpy only
    for prefix in parse_paths(d.paths)[1]:
        yield "data.paths (a prefix of megatron-preprocess's output)", prefix + ".idx"
        yield "data.paths (a prefix of megatron-preprocess's output)", prefix + ".bin"
    for name in ("tokenizer_model", "vocab_file", "merges_file"):
        if getattr(d, name):
            yield f"data.{name}", getattr(d, name)


def check_run_paths(cfg: Config, started: Optional[str] = None) -> None:
    """One InputError for the first path the run could not use. started: the folder the run
    whose config.yaml this is started in (started_in), where its relative paths were read."""
    for field, path in writable_dirs(cfg):
        check_output(field, path, "dir")  # writable, or creatable as a directory
    for field, path in readable_files(cfg):
        check_readable(field, path, os.path.isfile, "a readable file", started)
    load = cfg.checkpoint.load
    if load is not None and load != "auto":
        check_readable("checkpoint.load", load, os.path.exists,
                       "a checkpoints folder or one checkpoint folder (step_N)", started)


def _own_run(config_path: Optional[str]) -> Optional[RunDir]:
    """The run whose own config.yaml config_path is (its folder holds checkpoints or
    metrics), or None."""
    if not config_path or os.path.basename(config_path) != CONFIG:
        return None
    own = RunDir(os.path.dirname(os.path.abspath(config_path)))
    return own if os.path.isdir(own.checkpoints) or os.path.isfile(own.metrics) else None


def started_in(config_path: Optional[str]) -> Optional[str]:
    """The folder the run whose own config.yaml config_path is started in, where that file's
    relative paths (data, tokenizer, checkpoint.load) name what the run read: known when its
    recorded run.dir is relative and its folder ends with it. None otherwise."""
    own = _own_run(config_path)
    if own is None:
        return None
    import yaml
    try:
        with open(config_path) as f:
            recorded = ((yaml.safe_load(f) or {}).get("run") or {}).get("dir")
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    if not isinstance(recorded, str) or not recorded or os.path.isabs(recorded):
        return None
    tail = os.sep + os.path.normpath(recorded)
    folder = os.path.normpath(own.path)
    return folder[:-len(tail)] or os.sep if folder.endswith(tail) else None


def check_own_config(config_path: Optional[str], overrides: Sequence[str], cfg: Config) -> None:
    """A run's own config.yaml (the file to resume with), used without --set run.dir, must name
    its own folder. Its run.dir is as the run was given it: relative to the folder the run
    started in, or absolute where the run folder was before it was moved or copied. From anywhere
    else it names another folder, where checkpoint.load=auto would silently start afresh (or
    write into the original run): refused, naming both and the fixes."""
    own = _own_run(config_path)
    if own is None:
        return  # not a run's own config.yaml
    if any(o.split("=", 1)[0].strip() == "run.dir" for o in overrides):
        return  # a new run.dir on purpose (a new run from a run's settings, or this one)
    named = os.path.abspath(cfg.run.dir)
    if os.path.realpath(named) == os.path.realpath(own.path):
        return
    how = (f"relative to the folder that run started in, so from here ({os.getcwd()}) it is "
           f"{named}" if not os.path.isabs(cfg.run.dir) else
           "where that run was before its folder was moved or copied")
    raise InputError(f"{config_path} is the config.yaml of the run in {own.path}, but its "
                     f"run.dir={cfg.run.dir!r} names another folder ({how}): this run would start "
                     f"afresh there or write into that run. Continue this run with --set "
                     f"run.dir={own.path}; or run from the folder it was started in; or start a "
                     f"new run from its settings with --set run.dir=<a new folder>")


def check_readable(field: str, path: str, kind, expected: str,
                   started: Optional[str] = None) -> None:
    if not kind(path):
        why = (f"it does not exist{unexpanded(path)}" if not os.path.exists(path)
               else "it is not the right kind")
        there = os.path.join(started, path) if started and not os.path.isabs(path) else None
        if there and os.path.realpath(started) != os.path.realpath(os.getcwd()) and kind(there):
            raise InputError(
                f"{field}: {path!r} cannot be read from here ({os.getcwd()}: {why}): it is "
                f"relative, and this config.yaml is a run's, which started in {started}, where "
                f"it is {there}; run from {started}, or give the path absolute with --set")
        hint = " (drop the suffix: a prefix names both .bin and .idx)" if path.endswith(
            (".bin.idx", ".bin.bin", ".idx.idx", ".idx.bin")) else ""
        raise InputError(f"{field}: {path!r} cannot be read ({why}): expected {expected}; "
                         f"fix the path{hint} (--set or the YAML file)")
    if not os.access(path, os.R_OK):
        raise InputError(f"{field}: {path!r} is not readable (permission denied): expected "
                         f"{expected}; fix its permissions")

