"""Mixture of experts: the model section's MoE field checks and the per-layer facts the model,
model_math and the planner share (which layers are MoE, an expert's width), torch-free.

A MoE layer replaces the dense MLP by `num_experts` MLPs of the model's activation, each
`moe_ffn_hidden_size` wide, and a router (a linear h -> E, no bias) that sends each token to
`moe_top_k` of them (docs/moe.md)."""
from __future__ import annotations

import typing
from typing import Literal

from megatron.config.errors import ConfigError

# softmax: the chosen softmax probabilities as weights; softmax_renorm: the same k experts, their
# probabilities renormalised to sum to 1 (= a softmax over the k chosen logits: Mixtral's router);
# sigmoid: sigmoid scores, the chosen normalised to sum to 1.
Router = Literal["softmax", "softmax_renorm", "sigmoid"]
ROUTERS = typing.get_args(Router)


def is_moe_layer(m, index: int) -> bool:
    """Layer `index` (0-based) is MoE: every moe_layer_freq-th layer from the first, as
    Megatron-LM's integer --moe-layer-freq."""
    return m.num_experts > 0 and index % m.moe_layer_freq == 0


def moe_layers(m) -> int:
    return sum(is_moe_layer(m, i) for i in range(m.num_layers))


def expert_ffn(m) -> int:
    return m.moe_ffn_hidden_size or m.ffn_hidden_size


def shared_ffn(m) -> int:
    """Width of each MoE layer's shared expert; 0: none."""
    return m.moe_shared_expert_ffn_hidden_size or 0


def check_fields(m) -> None:
    """The MoE fields of model section `m` (called from ModelConfig.__post_init__)."""
    if m.moe_shared_expert_ffn_hidden_size == 0:
        m.moe_shared_expert_ffn_hidden_size = None  # one spelling of "none" in records
    if m.num_experts < 0:
        raise ConfigError("model.num_experts", m.num_experts, "0 (a dense model) or a number "
                          "of experts >= 1")
    if m.num_experts == 0:
        return
    if not 1 <= m.moe_top_k <= m.num_experts:
        raise ConfigError("model.moe_top_k", m.moe_top_k,
                          f"between 1 and model.num_experts={m.num_experts}")
    if m.moe_ffn_hidden_size is not None and m.moe_ffn_hidden_size < 1:
        raise ConfigError("model.moe_ffn_hidden_size", m.moe_ffn_hidden_size,
                          "a positive width, or null for model.ffn_hidden_size")
    if m.moe_layer_freq < 1:
        raise ConfigError("model.moe_layer_freq", m.moe_layer_freq,
                          "1 (every layer MoE) or k >= 1 (every k-th layer, from the first)")
    if m.moe_capacity_factor is not None and not m.moe_capacity_factor > 0:
        raise ConfigError("model.moe_capacity_factor", m.moe_capacity_factor,
                          "a factor > 0, or null for dropless routing")
    if m.moe_router not in ROUTERS:
        raise ConfigError("model.moe_router", m.moe_router, f"one of {', '.join(ROUTERS)}")
    if not m.moe_router_bias_update_rate >= 0:
        raise ConfigError("model.moe_router_bias_update_rate", m.moe_router_bias_update_rate,
                          "a rate >= 0 (DeepSeek-V3: 0.001)", "use 0 for no router bias")
    if m.moe_shared_expert_ffn_hidden_size is not None and m.moe_shared_expert_ffn_hidden_size < 0:
        raise ConfigError("model.moe_shared_expert_ffn_hidden_size",
                          m.moe_shared_expert_ffn_hidden_size,
                          "a positive width, or 0 / null for no shared expert")
    for name in ("moe_aux_loss_coeff", "moe_z_loss_coeff"):
        if getattr(m, name) < 0:
            raise ConfigError(f"model.{name}", getattr(m, name), "a coefficient >= 0",
                              "use 0 to switch that loss off")
