"""Modules of the user's that register variants, schedules or fused ops (config/variants.py,
config/schedules/, kernels/registry.py), imported before a config is checked so that its fields
can name what they register. Three ways in, one import rule:

- `run.plugins: [mypkg.variants]` in a config (or `--set 'run.plugins=[mypkg.variants]'`):
  imported whenever that config is read, so a run's saved config.yaml brings its plugins to
  resuming, megatron-generate, megatron-convert and megatron-plan --config;
- `megatron-train --plugin mypkg.variants`: imported first, then recorded in run.plugins (so the
  run's config.yaml names it);
- MEGATRON_PLUGINS=a.b,c.d for every command of a job (torchrun and srun start each rank with the
  same environment); not recorded: it is the job's environment, not the run's.

A module not found on the import path is looked for in the current directory too, as
`python -m` would find it: a console script (megatron-train) does not put the current directory
on sys.path, and a plugin beside the config is the usual place."""
from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Iterable, List

from megatron.config.errors import ConfigError

ENV = "MEGATRON_PLUGINS"
FIELD = "run.plugins"
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
# The fix a refused registry name (model.normalization, parallel.pipeline_schedule, ...) names.
NAME_HINT = (f"a name of your own needs the module that registers it: {FIELD} in the config, "
             f"megatron-train --plugin MODULE, or {ENV}=MODULE")


def registry_fix(key: str) -> str:
    """The fix of a refused registry name (`key`: model.normalization, ...): a registered name, or
    the plugin that registers one's own."""
    return f"pick one with --set {key}=... or in the YAML file; {NAME_HINT}"


def check_names(value, field: str = FIELD) -> List[str]:
    """run.plugins' value: a list of dotted module names (not file paths)."""
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise ConfigError(field, value, "a list of Python module names, e.g. [mypkg.variants]")
    for name in value:
        if not _MODULE.match(name):
            raise ConfigError(field, value, f"dotted Python module names ({name!r} is not one)",
                              "name the module as import would (mypkg/variants.py is "
                              "mypkg.variants), its folder on PYTHONPATH or the current "
                              "directory")
    return value


def import_listed(value, field: str = FIELD) -> None:
    """Imports a config's run.plugins (checked first: the import comes before the sections)."""
    for name in check_names(value, field):
        _import(name, field)


def load_plugins(modules: Iterable[str] = ()) -> List[str]:
    """Imports `modules` (--plugin) and those MEGATRON_PLUGINS names; returns the names."""
    modules = [n.strip() for n in modules if n.strip()]
    env = [n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip()]
    for name in check_names(modules, "--plugin"):
        _import(name, "--plugin")
    for name in check_names(env, ENV):
        _import(name, ENV)
    return modules + env


def _import(name: str, field: str) -> None:
    try:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if not _add_working_dir(name, e):
                raise
            importlib.import_module(name)
    except ImportError as e:
        raise _not_importable(name, field, e) from None


def _add_working_dir(name: str, e: ModuleNotFoundError) -> bool:
    """Puts the current directory at the end of sys.path (never ahead of an installed module)
    when the plugin's package itself was not found and the directory holds it."""
    top, here = name.split(".")[0], os.getcwd()
    if e.name != top or here in sys.path or "" in sys.path:
        return False
    if not (os.path.isdir(os.path.join(here, top))
            or os.path.isfile(os.path.join(here, top + ".py"))):
        return False
    sys.path.append(here)
    importlib.invalidate_caches()
    return True


def _not_importable(name: str, field: str, e: ImportError) -> ConfigError:
    return ConfigError(field, name, "an importable Python module that registers model "
                       f"variants, schedules or fused ops ({e})",
                       "check the module's name and that its folder is on PYTHONPATH or is the "
                       "current directory")
