"""Modules of the user's that register variants, schedules or fused ops (config/variants.py,
config/schedules/, kernels/registry.py), imported before a config is read so that --set can
name what they register: `megatron-train --plugin mypkg.variants`, or for every command of a
job (torchrun and srun start each rank with the same environment) MEGATRON_PLUGINS=a.b,c.d."""
from __future__ import annotations

import importlib
import os
from typing import Iterable, List

from megatron.config.errors import ConfigError

ENV = "MEGATRON_PLUGINS"


def load_plugins(modules: Iterable[str] = ()) -> List[str]:
    """Imports `modules` and those MEGATRON_PLUGINS names; returns the names imported."""
    names = [n.strip() for n in list(modules) + os.environ.get(ENV, "").split(",") if n.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ConfigError("--plugin" if name in modules else ENV, name,
                              "an importable Python module that registers model variants, "
                              f"schedules or fused ops ({e})",
                              "check the module's name and that its folder is on PYTHONPATH")
    return names
