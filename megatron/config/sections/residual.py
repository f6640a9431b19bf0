"""The model's residual sub-section (`model.residual`): what joins the residual stream beyond a
pre-norm layer's plain sums: each sub-block's output normalised before it is added (Gemma 2 and
3's norms after the attention and after the MLP), and the token embedding scaled as it enters
(Gemma's sqrt(hidden)). Read by the decoder layer and the embedding (model/), the Hugging Face
converters and the planner through the model section (m.residual). Each field's docstring is its
entry in docs/config.md (config/reference.py)."""
from __future__ import annotations

from dataclasses import dataclass

from megatron.config.sections.checks import finite, positive

S = "model.residual"


@dataclass
class ResidualConfig:
    post_norms: bool = False
    """Normalise the attention's and the MLP's outputs (model.normalization, weights of their
    own) before each is added to the residual stream, beside the norms before them: x + norm(
    attn(norm(x))), then the same around the MLP (Gemma 2 and 3's post_attention_layernorm and
    post_feedforward_layernorm)."""
    embedding_multiplier: float = 1.0
    """The token embedding's output times this, rounded to the activations' dtype as it is
    applied (Gemma: sqrt(model.hidden_size)); the tied output layer reads the embedding table
    unscaled."""

    def __post_init__(self):
        finite(S, self)
        positive(S, "embedding_multiplier", self.embedding_multiplier)


__all__ = ["ResidualConfig"]
