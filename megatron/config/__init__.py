from megatron.config.errors import ConfigError, InputError
from megatron.config.sections import (DataConfig, KernelsConfig, ModelConfig, OptimizerConfig,
                                      ParallelConfig, RunConfig, TrainingConfig)
from megatron.config.loader import Config, load_config, parse_overrides
from megatron.config.validate import validate_for_world
from megatron.config.deepspeed_json import deepspeed_config

__all__ = ["Config", "ConfigError", "InputError", "DataConfig", "KernelsConfig", "ModelConfig",
           "OptimizerConfig", "ParallelConfig", "RunConfig", "TrainingConfig", "load_config",
           "parse_overrides", "validate_for_world", "deepspeed_config"]
