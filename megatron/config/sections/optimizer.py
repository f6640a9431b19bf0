"""The optimizer section: AdamW and the learning-rate schedule (engine/)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Tuple

from megatron.config.errors import ConfigError
from megatron.config.sections.checks import check_choices, finite, fraction, positive

# The schedule's fields a decay style leaves unread (engine/optimizer.lr_at), beside wsd's own
# two, which only wsd reads: the unread-settings warning (config/unused.py) names them, and a
# resume compares only what either schedule reads (engine/optimizer.schedule_change).
UNREAD_BY_STYLE = {"constant": ("min_lr", "lr_decay_iters", "lr_decay_samples"),
                   "inverse-square-root": ("lr_decay_iters", "lr_decay_samples")}
WSD_FIELDS = ("lr_wsd_decay_iters", "lr_wsd_decay_samples", "lr_wsd_decay_style")
# The schedule's lengths in samples (Megatron-LM's --lr-*-samples) and in steps: setting any of
# the first makes the schedule count samples, and the second must then stay unset.
SAMPLE_FIELDS = ("lr_warmup_samples", "lr_decay_samples", "lr_wsd_decay_samples")
STEP_FIELDS = ("lr_warmup_iters", "lr_decay_iters", "lr_wsd_decay_iters")


def unread_fields(style: str) -> Tuple[str, ...]:
    """The optimizer fields lr_at does not read under lr_decay_style `style`."""
    return UNREAD_BY_STYLE.get(style, ()) + (() if style == "wsd" else WSD_FIELDS)


def counts_samples(opt_cfg) -> bool:
    """Whether the schedule counts the samples its steps consumed (an lr_*_samples field it
    reads is set) rather than its steps."""
    read = SAMPLE_FIELDS if opt_cfg.lr_decay_style == "wsd" else SAMPLE_FIELDS[:2]
    return any(getattr(opt_cfg, name) is not None for name in read)


def schedule_lengths(opt_cfg, end: int) -> Tuple[int, int, Optional[int]]:
    """The warm-up, the decay's end and wsd's decay in the schedule's unit (samples where it
    counts them, else steps); `end`: the decay's end where none is set (training.train_iters,
    or the samples its steps take)."""
    if counts_samples(opt_cfg):
        return (opt_cfg.lr_warmup_samples or 0, opt_cfg.lr_decay_samples or end,
                opt_cfg.lr_wsd_decay_samples)
    return opt_cfg.lr_warmup_iters, opt_cfg.lr_decay_iters or end, opt_cfg.lr_wsd_decay_iters


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
    lr_warmup_samples: Optional[int] = None
    """The warm-up's length in samples (Megatron-LM's --lr-warmup-samples). Setting this,
    lr_decay_samples or lr_wsd_decay_samples makes the schedule count the samples its steps
    consumed instead of its steps (with training.rampup_batch_size the two differ: early steps
    are smaller); lr_warmup_iters, lr_decay_iters and lr_wsd_decay_iters must then stay unset.
    null: no warm-up (counting samples) or lr_warmup_iters (counting steps). inverse-square-root
    counting samples: lr x sqrt(max(lr_warmup_samples, the step's batch) / samples taken)."""
    lr_decay_samples: Optional[int] = None
    """Counting samples: the samples after which the decay reaches min_lr (from the first,
    the warm-up included; Megatron-LM's --lr-decay-samples). null: the samples
    training.train_iters steps take at this run's batch sizes (a resume with another batch
    size moves it; the resume names the change)."""
    lr_wsd_decay_samples: Optional[int] = None
    """Counting samples under lr_decay_style=wsd: the decay's length in samples, ending where
    the decay ends; required there (Megatron-LM's --lr-wsd-decay-samples)."""

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
        for name in ("lr_wsd_decay_iters",) + SAMPLE_FIELDS:
            if getattr(self, name) is not None:
                positive(s, name, getattr(self, name), allow_zero=name == "lr_warmup_samples")
        self._check_units()

    def _check_units(self) -> None:
        """The schedule's lengths in one unit, and wsd's length in it."""
        samples = counts_samples(self)
        if samples:
            given = next(n for n in SAMPLE_FIELDS if getattr(self, n) is not None)
            for name in STEP_FIELDS:
                if getattr(self, name) not in (None, 0):
                    raise ConfigError(f"optimizer.{name}", getattr(self, name),
                                      f"unset while optimizer.{given} is set (the schedule "
                                      "then counts samples)", "give the schedule's lengths in "
                                      "samples (lr_*_samples) or in steps (lr_*_iters), not "
                                      "both")
        wsd = "lr_wsd_decay_samples" if samples else "lr_wsd_decay_iters"
        if self.lr_decay_style == "wsd" and getattr(self, wsd) is None:
            unit = "samples" if samples else "steps"
            raise ConfigError(f"optimizer.{wsd}", None,
                              f"the decay's length in {unit} with optimizer.lr_decay_style=wsd",
                              f"set optimizer.{wsd} (e.g. a tenth to a fifth of the run's "
                              f"{unit}), or choose another lr_decay_style")
