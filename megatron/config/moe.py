"""Mixture of experts: the per-layer facts the model, model_math and the planner share (which
layers are MoE, an expert's width), read from a model section's `moe` sub-section
(config/sections/moe.py holds its fields and their checks), torch-free.

A MoE layer replaces the dense MLP by `model.moe.num_experts` MLPs of the model's activation,
each `model.moe.ffn_hidden_size` wide, and a router (a linear h -> E, no bias) that sends each
token to `model.moe.top_k` of them (docs/moe.md)."""
from __future__ import annotations

import typing
from typing import Literal


# softmax: the chosen softmax probabilities as weights; softmax_renorm: the same k experts, their
# probabilities renormalised to sum to 1 (= a softmax over the k chosen logits: Mixtral's router);
# sigmoid: sigmoid scores, the chosen normalised to sum to 1.
Router = Literal["softmax", "softmax_renorm", "sigmoid"]
ROUTERS = typing.get_args(Router)


def is_moe_layer(m, index: int) -> bool:
    """Layer `index` (0-based) is MoE: every model.moe.layer_freq-th layer from the first, as
    Megatron-LM's integer --moe-layer-freq."""
    return m.moe.num_experts > 0 and index % m.moe.layer_freq == 0


def moe_layers(m) -> int:
    return sum(is_moe_layer(m, i) for i in range(m.num_layers))


def expert_ffn(m) -> int:
    return m.moe.ffn_hidden_size or m.ffn_hidden_size


def shared_ffn(m) -> int:
    """Width of each MoE layer's shared expert; 0: none."""
    return m.moe.shared_expert_ffn_hidden_size or 0
