"""The optimizer section: AdamW and the learning-rate schedule (engine/)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Tuple

from megatron.config.errors import ConfigError
from megatron.config.sections.checks import check_choices, finite, fraction, positive

# The schedule's fields a decay style leaves unread (engine/optimizer.lr_at), beside wsd's own
# two, which only wsd reads: the unread-settings warning (config/unused.py) names them, and a
# resume compares only what either schedule reads (engine/optimizer.schedule_change).
UNREAD_BY_STYLE = {"constant": ("min_lr", "lr_decay_iters"),
                   "inverse-square-root": ("lr_decay_iters",)}
WSD_FIELDS = ("lr_wsd_decay_iters", "lr_wsd_decay_style")


def unread_fields(style: str) -> Tuple[str, ...]:
    """The optimizer fields lr_at does not read under lr_decay_style `style`."""
    return UNREAD_BY_STYLE.get(style, ()) + (() if style == "wsd" else WSD_FIELDS)


@dataclass
class OptimizerConfig:
    lr: float = 1e-3
    """Peak learning rate, reached after the warm-up."""
    min_lr: float = 1e-4
    """The learning rate the decay ends at, at most lr."""
    weight_decay: float = 0.1
    """AdamW's decoupled weight decay, on matrices and embeddings (every 1-D parameter, norms
    and biases, has none)."""
    adam_beta1: float = 0.9
    """Adam's decay rate of the gradient's running mean, in [0, 1)."""
    adam_beta2: float = 0.95
    """Adam's decay rate of the squared gradient's running mean, in [0, 1)."""
    adam_eps: float = 1e-8
    """Added to the denominator of Adam's update (at least 0)."""
    lr_warmup_iters: int = 0
    """Steps of linear warm-up from 0 to lr."""
    lr_decay_style: Literal["cosine", "linear", "constant", "wsd",
                            "inverse-square-root"] = "cosine"
    """The learning rate's shape from lr to min_lr after the warm-up. wsd (warm-up, stable,
    decay): lr held until the last lr_wsd_decay_iters steps before the decay's end, then
    lowered to min_lr in the shape lr_wsd_decay_style; a checkpoint from the stable part can
    be cooled down at any later step by resuming with another training.train_iters (or
    lr_decay_iters), as Hu et al. (MiniCPM, 2024) and Hagele et al. (2024) train.
    inverse-square-root: lr x sqrt(max(lr_warmup_iters, 1) / steps taken), never below min_lr,
    with no end (as Megatron-LM's; lr_decay_iters and train_iters do not move it)."""
    lr_decay_iters: Optional[int] = None
    """The step at which the decay reaches min_lr (counted from step 0, the warm-up included);
    min_lr afterwards. null: training.train_iters."""
    lr_wsd_decay_iters: Optional[int] = None
    """Under lr_decay_style=wsd, the decay's length in steps, ending where the decay ends
    (lr_decay_iters, else training.train_iters); at most that step minus lr_warmup_iters.
    Required with wsd (Hagele et al. cool down over the last 10-20% of the steps)."""
    lr_wsd_decay_style: Literal["1-sqrt", "linear", "cosine", "exponential"] = "1-sqrt"
    """The shape of wsd's decay over its fraction r of the decay steps, a factor on lr - min_lr:
    1-sqrt, 1 - sqrt(r) (the cool-down Hagele et al. found best; Megatron-LM's minus_sqrt);
    linear, 1 - r; cosine, (1 + cos(pi r)) / 2; exponential, 2 x 0.5^r - 1 (Megatron-LM's
    default). Always from lr to min_lr."""

    def __post_init__(self):
        s = "optimizer"
        finite(s, self)
        positive(s, "lr", self.lr)
        positive(s, "min_lr", self.min_lr, allow_zero=True)
        positive(s, "weight_decay", self.weight_decay, allow_zero=True)
        positive(s, "adam_eps", self.adam_eps, allow_zero=True)
        positive(s, "lr_warmup_iters", self.lr_warmup_iters, allow_zero=True)
        check_choices(s, self)
        for name in ("adam_beta1", "adam_beta2"):
            fraction(s, name, getattr(self, name))
        if self.min_lr > self.lr:
            raise ConfigError("optimizer.min_lr", self.min_lr, f"at most optimizer.lr={self.lr}")
        if self.lr_decay_iters is not None:
            positive(s, "lr_decay_iters", self.lr_decay_iters)
        if self.lr_wsd_decay_iters is not None:
            positive(s, "lr_wsd_decay_iters", self.lr_wsd_decay_iters)
        elif self.lr_decay_style == "wsd":
            raise ConfigError("optimizer.lr_wsd_decay_iters", None,
                              "the decay's length in steps with optimizer.lr_decay_style=wsd",
                              "set optimizer.lr_wsd_decay_iters (e.g. a tenth to a fifth of "
                              "training.train_iters), or choose another lr_decay_style")
