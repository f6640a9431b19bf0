"""AdamW with weight-decay groups and the warmup-then-decay learning-rate schedule.

A torch optimizer, never DeepSpeed's own Adam (which compiles an op at run time): fused AdamW on
GPUs, the foreach implementation on the CPU."""
from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Dict, List, Optional, Tuple

import torch

from megatron.config.sections.optimizer import (SAMPLE_FIELDS, STEP_FIELDS, counts_samples,
                                                schedule_lengths, unread_fields)


def _dims(p: torch.nn.Parameter) -> int:
    """Dimensions of one tensor: stacked experts (model/moe/experts.py) have one more."""
    return p.ndim - (getattr(p, "expert_dim", None) is not None)


def param_groups(model: torch.nn.Module, weight_decay: float) -> List[Dict]:
    """No decay on norms and biases (every 1-D parameter), decay on matrices and embeddings."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if _dims(p) < 2 else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def split_expert_groups(groups: List[Dict]) -> List[Dict]:
    """Each group's experts split over ranks (marked `allreduce = False`, engine/experts.py)
    in a group of their own, `moe: True` and named by their expert-data-parallel group, as
    DeepSpeed's ZeRO partitions them over that group."""
    out = []
    for g in groups:
        experts = [p for p in g["params"] if getattr(p, "allreduce", True) is False]
        dense = [p for p in g["params"] if getattr(p, "allreduce", True) is not False]
        out += [dict(g, params=dense)] if dense else []
        out += [dict(g, params=experts, moe=True, name=experts[0].group_name)] if experts else []
    return out


def build_optimizer(model: torch.nn.Module, opt_cfg, device: torch.device):
    kwargs = {"fused": True} if device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(split_expert_groups(param_groups(model, opt_cfg.weight_decay)),
                             lr=opt_cfg.lr,
                             betas=(opt_cfg.adam_beta1, opt_cfg.adam_beta2), eps=opt_cfg.adam_eps,
                             **kwargs)


# A decay's factor on lr - min_lr at the fraction r of its steps: 1 at r = 0, 0 at r = 1
# (exponential is Megatron-LM's wsd default).
_SHAPES = {"linear": lambda r: 1.0 - r, "cosine": lambda r: 0.5 * (1.0 + math.cos(math.pi * r)),
           "1-sqrt": lambda r: 1.0 - math.sqrt(r), "exponential": lambda r: 2.0 * 0.5 ** r - 1.0}


def lr_at(position: int, opt_cfg, end: int, size: int = 1) -> float:
    """Linear warmup to lr, then cosine/linear decay to min_lr at the decay's end, then min_lr;
    wsd holds lr until its decay's length before that end and decays over it;
    inverse-square-root falls as lr x sqrt(warm-up / steps taken), never below min_lr, with no
    end (Megatron-LM's inverse-square-root: the decay's end is not read).

    position: the steps taken before this one, or, where the schedule counts samples, the
    samples they consumed; size: this step's own, 1 or its global batch; end: the decay's end
    where the optimizer section sets none (training.train_iters, or the samples its steps
    take). Counting samples with one batch size gives the rates counting steps does."""
    peak, floor = opt_cfg.lr, opt_cfg.min_lr
    warmup, decay_end, wsd = schedule_lengths(opt_cfg, end)
    if warmup and position < warmup:
        return peak * min(1.0, (position + size) / warmup)
    style = opt_cfg.lr_decay_style
    if style == "constant":
        return peak
    if style == "inverse-square-root":
        # lr itself at the warm-up's last step (or the first step without one)
        return max(floor, peak * math.sqrt(max(warmup, size) / (position + size)))
    if position >= decay_end:
        return floor
    if style == "wsd":
        begin = decay_end - wsd
        if position < begin:
            return peak
        coeff = _SHAPES[opt_cfg.lr_wsd_decay_style]((position - begin) / wsd)
    else:
        coeff = _SHAPES[style]((position - warmup) / max(size, decay_end - warmup))
    return floor + (peak - floor) * coeff


# The facts a checkpoint records of its learning-rate schedule: lr_at's inputs, the decay's end
# resolved (optimizer.lr_decay_iters, else training.train_iters; counting samples,
# lr_decay_samples, else the samples of train_iters steps).
SCHEDULE_KEYS = ("lr", "min_lr", "warmup_iters", "decay_style", "decay_iters")
# Recorded since they exist: a record without them was written with these (wsd's two; then the
# schedule in samples)
LATER_DEFAULTS = {"wsd_decay_iters": None, "wsd_decay_style": "1-sqrt", "unit": "steps",
                  "warmup_samples": None, "decay_samples": None, "wsd_decay_samples": None}


# Each recorded key's optimizer field (the decay's end is recorded resolved, see above); beside
# them "unit", steps or samples.
_RECORDED = {"lr": "lr", "min_lr": "min_lr", "warmup_iters": "lr_warmup_iters",
             "decay_style": "lr_decay_style", "decay_iters": "lr_decay_iters",
             "wsd_decay_iters": "lr_wsd_decay_iters", "wsd_decay_style": "lr_wsd_decay_style",
             "warmup_samples": "lr_warmup_samples", "decay_samples": "lr_decay_samples",
             "wsd_decay_samples": "lr_wsd_decay_samples"}


def _read_keys(style: str, unit: str) -> Tuple[str, ...]:
    """The recorded keys lr_at reads under `style` counting `unit`: a change in the others
    changes no rate."""
    unread = unread_fields(style) + (STEP_FIELDS if unit == "samples" else SAMPLE_FIELDS)
    return tuple(key for key, name in _RECORDED.items() if name not in unread) + ("unit",)


def schedule_record(opt_cfg, train_iters: int, train_samples: int) -> Dict:
    """lr_at's inputs with the decay's end resolved: train_iters steps take train_samples."""
    record = {key: getattr(opt_cfg, name) for key, name in _RECORDED.items()}
    if counts_samples(opt_cfg):
        record.update(unit="samples", decay_samples=record["decay_samples"] or train_samples)
    else:
        record.update(unit="steps", decay_iters=record["decay_iters"] or train_iters)
    return record


def rate(opt_cfg, step: int, samples: int, batch: int, train_iters: int,
         train_samples: int) -> float:
    """The rate of the step after `step` steps that consumed `samples`, of `batch` samples, in
    a run of train_iters steps that take train_samples: lr_at in the schedule's unit."""
    if counts_samples(opt_cfg):
        return lr_at(samples, opt_cfg, train_samples, batch)
    return lr_at(step, opt_cfg, train_iters)


def _record_lr(record: Dict, step: int, samples: int, batch: int) -> float:
    """rate under a recorded schedule (its decay's end resolved)."""
    as_cfg = SimpleNamespace(**{name: record[key] for key, name in _RECORDED.items()})
    return rate(as_cfg, step, samples, batch, record["decay_iters"], record["decay_samples"])


def _decay_end_hint(saved: Dict, opt_cfg, changed: Dict) -> str:
    """Where the run's length alone moved the decay's end: the setting that keeps it."""
    for key, field in (("decay_iters", "lr_decay_iters"), ("decay_samples", "lr_decay_samples")):
        if set(changed) == {key} and getattr(opt_cfg, field) is None:
            unit = "step" if key == "decay_iters" else "the sample"
            return (f". training.train_iters sets the decay's end while optimizer.{field} is "
                    f"not set: to train longer on the checkpoint's schedule (min_lr after "
                    f"{unit} {saved[key]}), set optimizer.{field}={saved[key]}")
    return ""


def schedule_change(saved: Dict, opt_cfg, t, consumed: int
                    ) -> Optional[Tuple[Dict, float, float, str]]:
    """What a resume does to the learning rate when this run's schedule is not the one the
    checkpoint recorded: ({field: [checkpoint's, this run's]}, lr of the next step under the
    checkpoint's schedule, under this run's, and one line for the log); None when the schedule is
    the same, or the checkpoint predates the record (it holds only last_step). t: this run's
    training section; consumed: the samples the checkpoint's steps took (its data record),
    where the record predates counting them."""
    if not all(k in saved for k in SCHEDULE_KEYS):
        return None
    saved = {**LATER_DEFAULTS, **saved}
    now = schedule_record(opt_cfg, t.train_iters, t.total_samples())
    # the keys either schedule reads: a key neither reads changes no rate
    read = set(_read_keys(saved["decay_style"], saved["unit"]))
    read |= set(_read_keys(now["decay_style"], now["unit"]))
    keys = [k for k in list(_RECORDED) + ["unit"] if k in read]
    changed = {k: [saved[k], now[k]] for k in keys if saved[k] != now[k]}
    if not changed:
        return None
    step, samples = int(saved["last_step"]), int(saved.get("samples", consumed))
    batch = t.global_batch_at(consumed)
    before = _record_lr(saved, step, samples, batch)
    after = _record_lr(now, step, samples, batch)
    names = {key: f"optimizer.{name}" for key, name in _RECORDED.items()}
    names["decay_iters"] = "the decay's end (optimizer.lr_decay_iters, else training.train_iters)"
    names["decay_samples"] = ("the decay's end in samples (optimizer.lr_decay_samples, else "
                              "the samples of training.train_iters steps)")
    names["unit"] = "what the schedule counts"
    what = "; ".join(f"{names[k]} {a} -> {b}" for k, (a, b) in changed.items())
    text = f"the learning-rate schedule changed on resume ({what}): step {step + 1} trains at "
    text += (f"lr {after:.3g} under both, and the two part after it" if math.isclose(before, after)
             else f"lr {after:.3g}, where the checkpoint's schedule gives {before:.3g}")
    return changed, before, after, text + _decay_end_hint(saved, opt_cfg, changed)


class WarmupDecayLR:
    """DeepSpeed calls step() after every optimizer step that was not skipped (fp16 overflow),
    so the schedule counts the steps taken and the samples they consumed (Megatron-LM's
    scheduler does the same). t: the training section (the run's length, its batches)."""

    def __init__(self, optimizer, opt_cfg, t):
        self.optimizer, self.opt_cfg, self.train_iters = optimizer, opt_cfg, t.train_iters
        self.train_samples = t.total_samples()
        self.batch = t.global_batch_at(0)  # the next step's samples (set_batch on a ramp)
        self.full_batch = t.global_batch_size
        self.last_step = self.samples = 0
        self._apply()

    def _apply(self) -> None:
        lr = rate(self.opt_cfg, self.last_step, self.samples, self.batch, self.train_iters,
                  self.train_samples)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def set_batch(self, batch: int) -> None:
        """The next steps take `batch` samples (a batch-size ramp's)."""
        if batch != self.batch:
            self.batch = batch
            self._apply()

    def step(self, *_args, **_kwargs) -> None:
        self.last_step += 1
        self.samples += self.batch
        self._apply()

    def get_last_lr(self) -> List[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def get_lr(self) -> List[float]:
        return self.get_last_lr()

    def state_dict(self) -> Dict:
        """The position, and the schedule's facts (a resume compares them: schedule_change)."""
        return {"last_step": self.last_step, "samples": self.samples,
                **schedule_record(self.opt_cfg, self.train_iters, self.train_samples)}

    def load_state_dict(self, state: Dict) -> None:
        """A checkpoint from before the samples were counted took last_step full batches."""
        self.last_step = int(state["last_step"])
        self.samples = int(state.get("samples", self.last_step * self.full_batch))
        self._apply()
