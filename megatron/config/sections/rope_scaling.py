"""The model's rotary-scaling sub-section (`model.rope_scaling`): how rotary frequencies are
stretched for contexts longer than the one a model was first trained on, as Hugging Face's
rope_scaling / rope_parameters describe it. Read by the rotary embedding (model/rotary.py) and the
Hugging Face converters through the model section (m.rope_scaling). Each field's docstring is its
entry in docs/config.md (config/reference.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from megatron.config.errors import ConfigError
from megatron.config.sections.checks import check_choices, finite, positive

S = "model.rope_scaling"


@dataclass
class RopeScalingConfig:
    type: Literal["none", "linear", "llama3"] = "none"
    """none: plain rotary frequencies. linear: every frequency divided by factor (position
    interpolation). llama3: Llama 3.1's frequency-dependent scaling: wavelengths shorter than
    original_max_position_embeddings / high_freq_factor kept, longer than
    original_max_position_embeddings / low_freq_factor divided by factor, those between blended
    smoothly (Llama 3.1-3.3: factor 8, low 1, high 4, original 8192)."""
    factor: float = 8.0
    """How far the frequencies are stretched (linear and llama3)."""
    low_freq_factor: float = 1.0
    """llama3: wavelengths above original_max_position_embeddings / low_freq_factor are divided
    by factor."""
    high_freq_factor: float = 4.0
    """llama3: wavelengths below original_max_position_embeddings / high_freq_factor are kept."""
    original_max_position_embeddings: Optional[int] = None
    """llama3: the context length the model was first trained on (8192 for Llama 3.1)."""

    def __post_init__(self):
        finite(S, self)
        check_choices(S, self)
        if self.type == "none":
            return
        if not self.factor > 0:
            raise ConfigError(f"{S}.factor", self.factor, "a factor > 0 (8 for Llama 3.1)")
        if self.type == "llama3":
            if self.original_max_position_embeddings is None:
                raise ConfigError(f"{S}.original_max_position_embeddings", None,
                                  "the context length the model was first trained on under "
                                  "type=llama3 (8192 for Llama 3.1)")
            positive(S, "original_max_position_embeddings",
                     self.original_max_position_embeddings)
            if not 0 < self.low_freq_factor < self.high_freq_factor:
                raise ConfigError(f"{S}.high_freq_factor", self.high_freq_factor,
                                  f"above {S}.low_freq_factor={self.low_freq_factor} > 0 "
                                  f"(Llama 3.1: 4 and 1)")


__all__ = ["RopeScalingConfig"]
