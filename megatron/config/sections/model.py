"""The model section: the architecture, read as one unit by the model builders, model_math and
the planner (which price a model section without a job), its mixture of experts a sub-section
(model.moe). Each field's docstring is its entry in
docs/config.md (config/reference.py)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Optional

from megatron.config import variants
from megatron.config.errors import ConfigError
from megatron.config.sections.checks import (at_most, check_choices, finite, fraction,
                                             positive, registry)
from megatron.config.sections.attention import AttentionConfig
from megatron.config.sections.output import OutputConfig
from megatron.config.sections.residual import ResidualConfig
from megatron.config.sections.moe import MoEConfig
from megatron.config.sections.rope_scaling import RopeScalingConfig

# Beyond any model trained or planned (the deepest published ones have about 100-200 layers,
# the longest contexts 10M tokens), and below where the planner's per-layer lists and sums
# run out of memory or overflow a float (10^12 layers, 10^25 tokens).
MODEL_LIMITS = {"num_layers": 100_000, "seq_length": 2 ** 30, "hidden_size": 2 ** 20,
                "num_attention_heads": 2 ** 16, "vocab_size": 2 ** 26}


def _variant(kind: str):
    """Metadata of a field that names a registered variant of `kind`."""
    return registry(functools.partial(variants.choices, kind), f"config/variants.py, {kind}")


@dataclass
class ModelConfig:
    num_layers: int = 2
    """Transformer layers."""
    hidden_size: int = 64
    """Width of the residual stream; a multiple of num_attention_heads unless
    attention.kv_channels is set."""
    num_attention_heads: int = 4
    """Query heads per layer; head size is attention.kv_channels, or hidden_size /
    num_attention_heads."""
    num_query_groups: Optional[int] = None
    """Grouped-query attention: number of key/value heads, a divisor of num_attention_heads.
    null: multi-head attention (as many key/value heads as query heads)."""
    ffn_hidden_size: Optional[int] = None
    """Width of the MLP's hidden layer. null: the activation's default (config/builtin_variants.py:
    4 x hidden_size for GeLU; for SwiGLU 8/3 x hidden_size rounded up to a multiple of 64, the same
    FLOPs as 4h GeLU)."""
    seq_length: int = 64
    """Tokens per sample (the context length trained on)."""
    max_position_embeddings: Optional[int] = None
    """Positions the learned position table holds, at least seq_length. null: seq_length."""
    vocab_size: int = 512
    """Vocabulary size when the tokenizer does not fix it (synthetic and null-tokenizer data)."""
    make_vocab_size_divisible_by: int = 128
    """The embedding table is padded to a multiple of this (times the tensor-parallel size), as
    Megatron-LM does, so each rank's slice has an aligned width."""
    position_embedding_type: str = field(default="learned", metadata=_variant("position"))
    """Position scheme, a registered variant: learned (a table of absolute positions) or rotary
    (RoPE: q and k rotated in each layer)."""
    rotary_base: float = 10000.0
    """RoPE's base (theta): wavelengths grow geometrically up to 2 pi x rotary_base."""
    normalization: str = field(default="layernorm", metadata=_variant("norm"))
    """Norm of each layer and the final one, a registered variant: layernorm or rmsnorm."""
    norm_epsilon: float = 1e-5
    """Epsilon added to the variance inside the norm."""
    activation: str = field(default="gelu", metadata=_variant("activation"))
    """MLP activation, a registered variant: gelu, swiglu (a gated MLP: fc1 is twice as wide), or
    geglu (the same gate through the tanh GeLU, Gemma's; torch's ops, no fused kernel)."""
    add_bias_linear: bool = True
    """Bias terms on the linear layers (false for LLaMA-style models)."""
    tie_embeddings: bool = True
    """The output layer shares the input embedding's weights."""
    hidden_dropout: float = 0.0
    """Dropout probability after attention and after the MLP, in [0, 1)."""
    attention_dropout: float = 0.0
    """Dropout probability on the attention probabilities, in [0, 1)."""
    attention_backend: str = field(default=variants.AUTO, metadata=_variant("attention"))
    """Attention core, a registered variant (flash, sdpa, math), or auto: the first core that
    can run on the device found at start-up (logged once)."""
    init_method_std: float = 0.02
    """Standard deviation of the normal initialisation of the weights."""
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    """Each head's width, biases and query/key norm, a sub-section (`model.attention.*`,
    config/sections/attention.py); its defaults are GPT-2's and Llama's heads."""
    rope_scaling: RopeScalingConfig = field(default_factory=RopeScalingConfig)
    """Rotary frequencies stretched for a longer context, a sub-section
    (`model.rope_scaling.*`, config/sections/rope_scaling.py: linear, or Llama 3.1's llama3);
    its default is none."""
    moe: MoEConfig = field(default_factory=MoEConfig)
    """Mixture of experts, a sub-section (`model.moe.*`, config/sections/moe.py, docs/moe.md);
    its defaults are a dense model."""
    residual: ResidualConfig = field(default_factory=ResidualConfig)
    """Norms after the attention and the MLP, and the embedding's scale, a sub-section
    (`model.residual.*`, config/sections/residual.py: Gemma 2 and 3); its defaults are a plain
    pre-norm layer."""
    output: OutputConfig = field(default_factory=OutputConfig)
    """The logits' cap, a sub-section (`model.output.*`, config/sections/output.py: Gemma 2);
    its default is none."""

    def __post_init__(self):
        s = "model"
        finite(s, self)
        for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                     "vocab_size", "make_vocab_size_divisible_by"):
            positive(s, name, getattr(self, name))
        for name, most in MODEL_LIMITS.items():
            at_most(s, name, getattr(self, name), most)
        check_choices(s, self)
        fraction(s, "hidden_dropout", self.hidden_dropout)
        fraction(s, "attention_dropout", self.attention_dropout)
        if isinstance(self.attention, dict):  # a saved config's mapping (Config.from_dict)
            self.attention = AttentionConfig(**self.attention)
        if isinstance(self.rope_scaling, dict):
            self.rope_scaling = RopeScalingConfig(**self.rope_scaling)
        if self.rope_scaling.type != "none" and not variants.of(self, "position").rotates_qk:
            raise ConfigError("model.rope_scaling.type", self.rope_scaling.type,
                              f"none for model.position_embedding_type="
                              f"{self.position_embedding_type}, whose positions rotate no "
                              f"queries or keys")
        if self.attention.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ConfigError("model.hidden_size", self.hidden_size,
                              f"a multiple of model.num_attention_heads={self.num_attention_heads}")
        if self.head_dim % 2 and variants.of(self, "position").rotates_qk:
            field_name = "attention.kv_channels" if self.attention.kv_channels else "hidden_size"
            raise ConfigError(f"model.{field_name}", self.head_dim,
                              f"an even head width for model.position_embedding_type="
                              f"{self.position_embedding_type} (rotary rotates pairs of "
                              f"channels); the head width is {self.head_dim}")
        if self.num_query_groups is not None:
            positive(s, "num_query_groups", self.num_query_groups)
            if self.num_attention_heads % self.num_query_groups:
                raise ConfigError("model.num_query_groups", self.num_query_groups,
                                  f"a divisor of model.num_attention_heads={self.num_attention_heads}")
        if isinstance(self.moe, dict):  # a saved config's mapping (Config.from_dict)
            self.moe = MoEConfig(**self.moe)
        if isinstance(self.residual, dict):
            self.residual = ResidualConfig(**self.residual)
        if isinstance(self.output, dict):
            self.output = OutputConfig(**self.output)
        self._defaults()

    def _defaults(self) -> None:
        """The fields whose null means "derived from the others"."""
        if self.max_position_embeddings is None:
            self.max_position_embeddings = self.seq_length
        if self.max_position_embeddings < self.seq_length:
            raise ConfigError("model.max_position_embeddings", self.max_position_embeddings,
                              f"at least model.seq_length={self.seq_length}")
        if self.ffn_hidden_size is None:
            act = variants.of(self, "activation")
            self.ffn_hidden_size = act.default_ffn(self.hidden_size) if act.default_ffn \
                else 4 * self.hidden_size
        positive("model", "ffn_hidden_size", self.ffn_hidden_size)

    @property
    def kv_heads(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.attention.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def qkv_bias(self) -> bool:
        """Whether the query/key/value projection has biases."""
        return self.add_bias_linear or self.attention.add_qkv_bias
