"""AdamW with weight-decay groups and the warmup-then-decay learning-rate schedule.

A torch optimizer, never DeepSpeed's own Adam (which compiles an op at run time): fused AdamW on
GPUs, the foreach implementation on the CPU."""
from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Dict, List, Optional, Tuple

import torch

from megatron.config.sections.optimizer import unread_fields


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


def lr_at(step: int, opt_cfg, train_iters: int) -> float:
    """Linear warmup to lr, then cosine/linear decay to min_lr at lr_decay_iters, then min_lr;
    wsd holds lr until the last lr_wsd_decay_iters steps before that end and decays over them;
    inverse-square-root falls as lr x sqrt(warm-up / steps taken), never below min_lr, with no
    end (Megatron-LM's inverse-square-root: lr_decay_iters is not read)."""
    peak, floor, warmup = opt_cfg.lr, opt_cfg.min_lr, opt_cfg.lr_warmup_iters
    if warmup and step < warmup:
        return peak * (step + 1) / warmup
    if opt_cfg.lr_decay_style == "constant":
        return peak
    if opt_cfg.lr_decay_style == "inverse-square-root":
        # step + 1 steps taken; lr itself at the warm-up's last step (or step 0 without one)
        return max(floor, peak * math.sqrt(max(warmup, 1) / (step + 1)))
    decay_iters = opt_cfg.lr_decay_iters or train_iters
    if step >= decay_iters:
        return floor
    if opt_cfg.lr_decay_style == "wsd":
        begin = decay_iters - opt_cfg.lr_wsd_decay_iters
        if step < begin:
            return peak
        coeff = _SHAPES[opt_cfg.lr_wsd_decay_style]((step - begin) / opt_cfg.lr_wsd_decay_iters)
    else:
        coeff = _SHAPES[opt_cfg.lr_decay_style]((step - warmup) / max(1, decay_iters - warmup))
    return floor + (peak - floor) * coeff


# The facts a checkpoint records of its learning-rate schedule: lr_at's inputs, the decay's end
# resolved (optimizer.lr_decay_iters, else training.train_iters).
SCHEDULE_KEYS = ("lr", "min_lr", "warmup_iters", "decay_style", "decay_iters")
# wsd's two, recorded since it exists: a record without them was written with their defaults
WSD_DEFAULTS = {"wsd_decay_iters": None, "wsd_decay_style": "1-sqrt"}


# Each recorded key's optimizer field (decay_iters is recorded resolved, see above).
_RECORDED = {"lr": "lr", "min_lr": "min_lr", "warmup_iters": "lr_warmup_iters",
             "decay_style": "lr_decay_style", "decay_iters": "lr_decay_iters",
             "wsd_decay_iters": "lr_wsd_decay_iters", "wsd_decay_style": "lr_wsd_decay_style"}


def _read_keys(style: str) -> Tuple[str, ...]:
    """The recorded keys lr_at reads under `style`: a change in the others changes no rate."""
    unread = unread_fields(style)
    return tuple(key for key, name in _RECORDED.items() if name not in unread)


def schedule_record(opt_cfg, train_iters: int) -> Dict:
    record = {key: getattr(opt_cfg, name) for key, name in _RECORDED.items()}
    record["decay_iters"] = record["decay_iters"] or train_iters
    return record


def _record_lr(record: Dict, step: int) -> float:
    as_cfg = SimpleNamespace(**{name: record[key] for key, name in _RECORDED.items()})
    return lr_at(step, as_cfg, record["decay_iters"])


def schedule_change(saved: Dict, opt_cfg, train_iters: int
                    ) -> Optional[Tuple[Dict, float, float, str]]:
    """What a resume does to the learning rate when this run's schedule is not the one the
    checkpoint recorded: ({field: [checkpoint's, this run's]}, lr of the next step under the
    checkpoint's schedule, under this run's, and one line for the log); None when the schedule is
    the same, or the checkpoint predates the record (it holds only last_step)."""
    if not all(k in saved for k in SCHEDULE_KEYS):
        return None
    saved = {**WSD_DEFAULTS, **saved}
    now = schedule_record(opt_cfg, train_iters)
    # the keys either schedule reads: a key neither reads changes no rate
    read = set(_read_keys(saved["decay_style"])) | set(_read_keys(now["decay_style"]))
    keys = [k for k in _RECORDED if k in read]
    changed = {k: [saved[k], now[k]] for k in keys if saved[k] != now[k]}
    if not changed:
        return None
    position = int(saved["last_step"])
    before, after = _record_lr(saved, position), _record_lr(now, position)
    names = {key: f"optimizer.{name}" for key, name in _RECORDED.items()}
    names["decay_iters"] = "the decay's end (optimizer.lr_decay_iters, else training.train_iters)"
    what = "; ".join(f"{names[k]} {a} -> {b}" for k, (a, b) in changed.items())
    text = f"the learning-rate schedule changed on resume ({what}): step {position + 1} trains at "
    text += (f"lr {after:.3g} under both, and the two part after it" if math.isclose(before, after)
             else f"lr {after:.3g}, where the checkpoint's schedule gives {before:.3g}")
    if set(changed) == {"decay_iters"} and opt_cfg.lr_decay_iters is None:
        text += (f". training.train_iters sets the decay's end while optimizer.lr_decay_iters is "
                 f"not set: to train longer on the checkpoint's schedule (min_lr after step "
                 f"{saved['decay_iters']}), set optimizer.lr_decay_iters={saved['decay_iters']}")
    return changed, before, after, text


class WarmupDecayLR:
    """DeepSpeed calls step() after every optimizer step that was not skipped (fp16 overflow)."""

    def __init__(self, optimizer, opt_cfg, train_iters: int):
        self.optimizer, self.opt_cfg, self.train_iters = optimizer, opt_cfg, train_iters
        self.last_step = 0
        self._apply()

    def _apply(self) -> None:
        lr = lr_at(self.last_step, self.opt_cfg, self.train_iters)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self, *_args, **_kwargs) -> None:
        self.last_step += 1
        self._apply()

    def get_last_lr(self) -> List[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def get_lr(self) -> List[float]:
        return self.get_last_lr()

    def state_dict(self) -> Dict:
        """The position, and the schedule's facts (a resume compares them: schedule_change)."""
        return {"last_step": self.last_step, **schedule_record(self.opt_cfg, self.train_iters)}

    def load_state_dict(self, state: Dict) -> None:
        self.last_step = int(state["last_step"])
        self._apply()
