from megatron.config import builtin_variants  # noqa: F401 (registers the built-in variants)
from megatron.config.errors import ConfigError, InputError
from megatron.config.sections import (CheckpointConfig, DataConfig, EvalConfig, KernelsConfig,
                                      ModelConfig, OptimizerConfig, ParallelConfig,
                                      ResilienceConfig, RunConfig, TrainingConfig)
from megatron.config.loader import Config, build_config, load_config, parse_overrides
from megatron.config.validate import validate_for_world

__all__ = ["Config", "ConfigError", "InputError", "CheckpointConfig", "DataConfig", "EvalConfig",
           "KernelsConfig", "ModelConfig", "OptimizerConfig", "ParallelConfig",
           "ResilienceConfig", "RunConfig", "TrainingConfig", "build_config", "load_config",
           "parse_overrides", "validate_for_world"]
