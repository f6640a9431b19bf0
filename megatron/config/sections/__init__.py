"""One dataclass per config section, each in the file of the components that read it. Field
checks live in __post_init__; checks that need several sections live in config/validate.py.
Field names follow Megatron-LM where one exists. Each field's docstring (the string right after
it) is its documentation: docs/config.md and `megatron-train --help-config` are generated from
them (config/reference.py)."""
from __future__ import annotations

from typing import Dict, Tuple

from megatron.config.sections.attention import AttentionConfig
from megatron.config.sections.checkpoint import CheckpointConfig
from megatron.config.sections.data import DataConfig, split_fractions
from megatron.config.sections.loss_scale import LossScaleConfig
from megatron.config.sections.model import ModelConfig
from megatron.config.sections.moe import MoEConfig
from megatron.config.sections.optimizer import OptimizerConfig
from megatron.config.sections.output import OutputConfig
from megatron.config.sections.parallel import ParallelConfig
from megatron.config.sections.residual import ResidualConfig
from megatron.config.sections.resilience import ResilienceConfig
from megatron.config.sections.rope_scaling import RopeScalingConfig
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


# Sub-sections: a field of a section that is a section of its own, written nested in YAML
# (model: {moe: {num_experts: 8}}) and dotted in --set (model.moe.num_experts=8).
SUBSECTIONS = {"model.attention": AttentionConfig, "model.rope_scaling": RopeScalingConfig,
               "model.moe": MoEConfig, "model.residual": ResidualConfig,
               "model.output": OutputConfig,
               "training.loss_scale": LossScaleConfig}

# The MoE fields that were model.<old> before model.moe held them (Megatron-LM's names, whose
# moe_ prefix the sub-section now says).
_MOE_RENAMED = {"num_experts": "num_experts", "moe_top_k": "top_k",
                "moe_ffn_hidden_size": "ffn_hidden_size", "moe_layer_freq": "layer_freq",
                "moe_capacity_factor": "capacity_factor", "moe_router": "router",
                "moe_aux_loss_coeff": "aux_loss_coeff", "moe_z_loss_coeff": "z_loss_coeff",
                "moe_router_bias_update_rate": "router_bias_update_rate",
                "moe_shared_expert_ffn_hidden_size": "shared_expert_ffn_hidden_size"}


# The loss-scaling fields that were training.<old> before training.loss_scale held them.
_LOSS_SCALE = {"initial_loss_scale_power": "initial_power", "loss_scale_window": "window",
               "hysteresis": "hysteresis", "min_loss_scale": "minimum"}


def field_at(section, dotted: str):
    """A section's value by its dotted key ("moe.layer_freq": the sub-section's field)."""
    for part in dotted.split("."):
        section = getattr(section, part)
    return section


def _moved(section: str, names: str) -> Dict[Tuple[str, str], Tuple[str, str]]:
    return {("training", name): (section, name) for name in names.split()}


# Keys that left the training section (41 fields for six components) for their owners' sections,
# under the same names; YAML files, --set and run directories' config.yaml written before still
# load through this map (config/renames.py). The names are the ones that moved, written out: a
# field added to those sections since (resilience.check_state, checkpoint.roll_back) never had
# a training.X key to load.
MOVED: Dict[Tuple[str, str], Tuple[str, str]] = {
    **_moved("eval", "eval_interval eval_iters"),
    **_moved("checkpoint", "save save_interval save_interval_minutes keep_last async_save "
                           "save_local_dir load new_data_stream keep_data_position init_from"),
    **_moved("resilience", "check_node max_skipped_steps max_loss_scale_skips loss_spike_factor "
                           "loss_spike_window loss_spike_action max_rollbacks "
                           "rerun_suspect_steps startup_timeout_minutes hang_timeout_minutes "
                           "straggler_interval straggler_factor"),
    **{("model", old): ("model", f"moe.{new}") for old, new in _MOE_RENAMED.items()},
    # fp16's loss scaler, into its sub-section (December 2026)
    **{("training", old): ("training", f"loss_scale.{new}") for old, new in _LOSS_SCALE.items()}}

__all__ = ["SECTIONS", "SUBSECTIONS", "MOVED", "AttentionConfig", "CheckpointConfig",
           "DataConfig", "EvalConfig", "LossScaleConfig", "OutputConfig",
           "KernelsConfig", "ModelConfig", "MoEConfig", "OptimizerConfig", "ParallelConfig",
           "ResidualConfig",
           "RopeScalingConfig",
           "ResilienceConfig", "RunConfig", "field_at",
           "TrainingConfig", "split_fractions"]
