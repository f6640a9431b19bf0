"""The model's attention sub-section (`model.attention`): how each head is shaped beyond the
head counts of the model section (its width, its biases, a norm of its queries and keys), read by
the attention layer, the Hugging Face converters and the planner through the model section
(m.attention). Each field's docstring is its entry in docs/config.md (config/reference.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from megatron.config.sections.checks import finite, positive

S = "model.attention"


@dataclass
class AttentionConfig:
    kv_channels: Optional[int] = None
    """Width of each attention head (Megatron's --kv-channels, Hugging Face's head_dim): the
    query, key and value projections are (key/value) heads x kv_channels wide. null:
    model.hidden_size / model.num_attention_heads. Qwen3 0.6B, 4B and 32B set it apart from
    that."""
    add_qkv_bias: bool = False
    """Biases on the query, key and value projections even when model.add_bias_linear=false
    (Megatron's --add-qkv-bias; Qwen2 and Qwen2.5)."""
    qk_norm: bool = False
    """Normalise each query and key head over its width, with model.normalization and weights of
    its own, after the projection and before rotary positions (Megatron Core's --qk-layernorm;
    Qwen3), which keeps attention logits from growing (Dehghani et al. 2023, ViT-22B)."""

    def __post_init__(self):
        finite(S, self)
        if self.kv_channels is not None:
            positive(S, "kv_channels", self.kv_channels)


__all__ = ["AttentionConfig"]
