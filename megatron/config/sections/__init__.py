"""One dataclass per config section, each in the file of the components that read it. Field
checks live in __post_init__; checks that need several sections live in config/validate.py.
Field names follow Megatron-LM where one exists. Each field's docstring (the string right after
it) is its documentation: docs/config.md and `megatron-train --help-config` are generated from
them (config/reference.py)."""
from __future__ import annotations

from typing import Dict, Tuple

from megatron.config.sections.checkpoint import CheckpointConfig
from megatron.config.sections.data import DataConfig, split_fractions
from megatron.config.sections.model import ModelConfig
from megatron.config.sections.optimizer import OptimizerConfig
from megatron.config.sections.parallel import ParallelConfig
from megatron.config.sections.resilience import ResilienceConfig
from megatron.config.sections.run import KernelsConfig, RunConfig
from megatron.config.sections.training import EvalConfig, TrainingConfig

# In the order config.yaml lists them.
SECTIONS = {
    "model": ModelConfig,
    "parallel": ParallelConfig,
    "training": TrainingConfig,
    "eval": EvalConfig,
    "checkpoint": CheckpointConfig,
    "resilience": ResilienceConfig,
    "optimizer": OptimizerConfig,
    "data": DataConfig,
    "kernels": KernelsConfig,
    "run": RunConfig,
}


def _moved(section: str, cls) -> Dict[Tuple[str, str], Tuple[str, str]]:
    return {("training", name): (section, name) for name in cls.__dataclass_fields__}


# Keys that left the training section (41 fields for six components) for their owners' sections,
# under the same names; YAML files, --set and run directories' config.yaml written before still
# load through this map (config/renames.py).
MOVED: Dict[Tuple[str, str], Tuple[str, str]] = {
    **_moved("eval", EvalConfig), **_moved("checkpoint", CheckpointConfig),
    **_moved("resilience", ResilienceConfig)}

__all__ = ["SECTIONS", "MOVED", "CheckpointConfig", "DataConfig", "EvalConfig", "KernelsConfig",
           "ModelConfig", "OptimizerConfig", "ParallelConfig", "ResilienceConfig", "RunConfig",
           "TrainingConfig", "split_fractions"]
