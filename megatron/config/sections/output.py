"""The model's output sub-section (`model.output`): what the output layer does to its logits
before the loss and before sampling, read by the output layers (model/embedding.py), the Hugging
Face converters and the loss's choice of its fused head (model/gpt.py). Each field's docstring
is its entry in docs/config.md (config/reference.py)."""
from __future__ import annotations

from dataclasses import dataclass

from megatron.config.sections.checks import finite, positive

S = "model.output"


@dataclass
class OutputConfig:
    logit_softcapping: float = 0.0
    """Each logit becomes cap x tanh(logit / cap) (Gemma 2's final_logit_softcapping, 30.0), in
    training's loss and in generation alike. 0: none. The capped logits are materialised, so the
    fused output-and-loss head (model/loss.py) is not used under a cap."""

    def __post_init__(self):
        finite(S, self)
        positive(S, "logit_softcapping", self.logit_softcapping, allow_zero=True)


__all__ = ["OutputConfig"]
