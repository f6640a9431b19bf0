"""The training section's fp16 loss-scaling sub-section (`training.loss_scale`): DeepSpeed's
dynamic loss scaler, which fp16 runs train under (training.precision=fp16; read into
deepspeed.json's fp16 block by base/deepspeed_json.py). bf16 and fp32 read none of it. Each
field's docstring is its entry in docs/config.md (config/reference.py)."""
from __future__ import annotations

from dataclasses import dataclass

from megatron.config.errors import ConfigError
from megatron.config.sections.checks import finite, positive

S = "training.loss_scale"


@dataclass
class LossScaleConfig:
    initial_power: int = 16
    """The first loss scale is 2**initial_power (0-127; DeepSpeed's default 16, Megatron-LM's
    --initial-loss-scale 2**32)."""
    window: int = 1000
    """Steps without an overflow before the loss scale doubles (at least 1; Megatron-LM's
    --loss-scale-window)."""
    hysteresis: int = 2
    """Overflows tolerated before the loss scale is lowered (at least 1)."""
    minimum: float = 1.0
    """The loss scale never drops below this (above 0; Megatron-LM's --min-loss-scale)."""

    def __post_init__(self):
        """DeepSpeed's scaler misbehaves quietly outside these: a window of 0 divides by zero at
        the first clean step, hysteresis 0 never lowers the scale (every step then overflows
        and is skipped), a minimum of 0 lets the scale, and so every gradient, reach 0;
        2**power must be a float32 number."""
        finite(S, self)
        if not 0 <= self.initial_power <= 127:
            raise ConfigError(f"{S}.initial_power", self.initial_power,
                              "an exponent in [0, 127] (2**power is the first fp16 loss scale; "
                              "DeepSpeed's default 16, Megatron-LM's 32)")
        positive(S, "window", self.window)
        positive(S, "hysteresis", self.hysteresis)
        positive(S, "minimum", self.minimum)


__all__ = ["LossScaleConfig"]
