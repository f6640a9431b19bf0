"""The model's attention sub-section (`model.attention`): how each head is shaped beyond the
head counts of the model section (its width, its biases, a norm of its queries and keys) and
which keys it sees (a sliding window), read by the attention layer, the Hugging Face converters
and the planner through the model section (m.attention). Each field's docstring is its entry in
docs/config.md (config/reference.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from megatron.config.errors import ConfigError
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
    sliding_window: int = 0
    """Each query sees at most this many keys: itself and the ones just before it (Mistral 7B
    v0.1's 4096; Hugging Face's sliding_window: key j is seen from query i when i - window < j
    <= i). 0: every earlier key. With data.reset_attention_mask, within its document too.
    Runs on the flash (its window_size), sdpa and math cores and under every context-parallel
    algorithm. The run report's FLOPs and megatron-plan's flash attention count what the window
    leaves (config/model_math.attention_keys); the sdpa and math cores attend in bands of
    max(window, 256) queries against the keys each band's window reaches, computing and masking
    those scores (s x (band + window) of them, not s x s; megatron-plan prices that:
    config/model_math.masked_keys)."""
    sliding_window_pattern: int = 0
    """With model.attention.sliding_window: every N-th layer (the N-th, the 2N-th, ...) sees
    every earlier key and the others the window (Hugging Face's sliding_window_pattern: Gemma
    2's and gpt-oss's 2, Gemma 3's 6). 0: every layer the window."""
    softmax_scale: Optional[float] = None
    """The attention scores' scale: softmax(q.k x this). null: 1 / sqrt(the head width). Gemma
    2 and 3 scale by query_pre_attn_scalar^-0.5 (Gemma 3 27B: 168^-0.5 with heads of 128).
    Applied to the queries (times softmax_scale x sqrt(head width)) before the attention
    core, so every core and context-parallel algorithm takes it."""
    logit_softcapping: float = 0.0
    """Each attention score, after its scale, becomes cap x tanh(score / cap) before the mask
    and the softmax (Gemma 2's attn_logit_softcapping, 50.0): no score exceeds the cap.
    0: none. The math core runs it (auto picks math where it would pick sdpa, whose kernel has
    no such step), flash-attn through its softcap argument, and every context-parallel
    algorithm (Ulysses around either core; ring, all-gather and hybrid in their blockwise
    attention, model/block_attention.py). The math core keeps the capped scores for backward:
    one more s x s tensor per head than without."""
    window_rotary_base: Optional[float] = None
    """With rotary positions: the base of the layers within a sliding window, which rotate
    with it and without model.rope_scaling, while the layers that see every key keep
    model.rotary_base and the scaling (Gemma 3's rope_local_base_freq, 10000 beside a global
    1000000). null: every layer model.rotary_base."""

    def __post_init__(self):
        finite(S, self)
        if self.kv_channels is not None:
            positive(S, "kv_channels", self.kv_channels)
        positive(S, "sliding_window", self.sliding_window, allow_zero=True)
        positive(S, "sliding_window_pattern", self.sliding_window_pattern, allow_zero=True)
        positive(S, "logit_softcapping", self.logit_softcapping, allow_zero=True)
        for name in ("window_rotary_base", "softmax_scale"):
            if getattr(self, name) is not None:
                positive(S, name, getattr(self, name))
        if self.sliding_window_pattern == 1:
            raise ConfigError(f"{S}.sliding_window_pattern", 1, "0 (every layer the window) or "
                              "2 or more (every N-th layer the whole sequence)",
                              "1 would give every layer the whole sequence: set "
                              f"{S}.sliding_window=0 instead")

    def window_of(self, index: int):
        """The window layer `index` (0-based) attends within, or None (every earlier key)."""
        if not self.sliding_window:
            return None
        n = self.sliding_window_pattern
        return None if n and (index + 1) % n == 0 else self.sliding_window


__all__ = ["AttentionConfig"]
