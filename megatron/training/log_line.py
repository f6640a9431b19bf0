"""The training log a person reads (a terminal, a Slurm output file on a login node): one line
per logged step, one clear line per event, formatted from the same records metrics.jsonl gets,
on rank 0 at log intervals only.

    step 120/1000 (12%) | elapsed 0:05:12 | ETA 0:38:40 | 12.3k tok/s | 45.2 TFLOP/s/GPU |
        MFU 23.6% | loss 3.4521 | lr 2.50e-04 | grad norm 0.812 | mem 41.3 GiB
    save: step 100, 12.50 GB in 8.1 s (1.54 GB/s; the loop waited 0.4 s)
    evaluation: step 100, valid loss 3.2100 (perplexity 24.8)

(one line each; wrapped here). The ETA is the time per step seen by this process so far (the
last step's time before a second line) times the steps left."""
from __future__ import annotations

import math
import time
from typing import Optional

from megatron.base.records import EvalRecord, MetricsRecord, StepRecord


def clock(seconds: float) -> str:
    s = int(round(seconds))
    days, s = divmod(s, 86400)
    text = f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
    return f"{days}d {text}" if days else text


def human(value: float, unit: str = "") -> str:
    """12345 -> '12.3k', 1.2e9 -> '1.20G'."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{prefix}{unit}"
    return f"{value:.3g}{unit}"


def size(gb: float) -> str:
    """Decimal bytes, as checkpoint sizes are logged: 0.0031 GB -> '3.1 MB'."""
    return f"{gb * 1000:.3g} MB" if gb < 1 else f"{gb:.3g} GB"


def memory(gib: float) -> str:
    return f"{gib * 1024:.0f} MiB" if gib < 1 else f"{gib:.1f} GiB"


def _num(value: Optional[float], fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


class LogLines:
    """Formats records; `total` is training.train_iters when known."""

    def __init__(self, total: Optional[int] = None, started: Optional[float] = None,
                 full_batch: Optional[int] = None):
        """full_batch: training.global_batch_size, which the steps of a batch-size ramp reach:
        while a line's batch is smaller, the ETA takes its step time scaled up to it."""
        self.total, self.started = total, time.monotonic() if started is None else started
        self.full_batch = full_batch
        self.first: Optional[tuple] = None  # (time, step) of the first step line

    def step_line(self, r: StepRecord, now: Optional[float] = None) -> str:
        now = time.monotonic() if now is None else now
        parts = [self._progress(r.step), f"elapsed {clock(now - self.started)}"]
        eta = self._eta(r, now)
        if eta is not None:
            parts.append(f"ETA {clock(eta)}")
        parts += [f"{human(r.tokens_per_sec)} tok/s", f"{r.tflops_per_gpu:.3g} TFLOP/s/GPU",
                  "MFU n/a" if r.mfu is None else f"MFU {r.mfu:.1%}",
                  f"loss {_num(r.loss, '.4f')}", f"lr {r.lr:.2e}",
                  f"grad norm {_num(r.grad_norm, '.3g')}", f"mem {memory(r.mem_gb)}"]
        if r.loss_scale is not None:
            parts.append(f"loss scale {r.loss_scale:g}")
        if r.skipped:
            parts.append("update skipped")
        if r.moe:
            parts.append(moe_part(r.moe))
        if r.global_batch_size is not None:
            parts.append(f"batch {r.global_batch_size}")
        return " | ".join(parts)

    def _progress(self, step: int) -> str:
        if not self.total:
            return f"step {step}"
        return f"step {step}/{self.total} ({step / self.total:.0%})"

    def _eta(self, r: StepRecord, now: float) -> Optional[float]:
        if not self.total:
            return None
        if self.first is None or r.step <= self.first[1]:
            self.first = (now, r.step)
            per_step = r.step_time_s
        else:
            per_step = (now - self.first[0]) / (r.step - self.first[1])
        ramp = r.global_batch_size
        if ramp and self.full_batch and ramp < self.full_batch and r.step_time_s is not None:
            per_step = r.step_time_s * self.full_batch / ramp  # the steps left grow to it
        return None if per_step is None else per_step * max(self.total - r.step, 0)

    def line(self, record: MetricsRecord) -> str:
        if isinstance(record, StepRecord):
            return self.step_line(record)
        if isinstance(record, EvalRecord):
            return eval_line(record)
        return event_line(record)


def moe_part(layers) -> str:
    """'moe aux X load max/mean Y drop Z%': the auxiliary losses summed over the MoE layers (what
    they add to the loss), the most loaded layer's busiest expert over its mean, and the share of
    assignments dropped over all layers."""
    aux = sum(layer["aux_loss"] + layer["z_loss"] for layer in layers)
    load = max(layer["tokens_per_expert_max"] / max(layer["tokens_per_expert_mean"], 1e-12)
               for layer in layers)
    drop = sum(layer["dropped_fraction"] for layer in layers) / len(layers)
    return f"moe aux {aux:.3g} load max/mean {load:.2f} drop {drop:.1%}"


def eval_line(r: EvalRecord) -> str:
    name = "validation" if r.split == "valid" else r.split
    if r.loss is None or not math.isfinite(r.loss):
        return f"evaluation: step {r.step}, {name} loss {r.loss}"
    ppl = math.exp(r.loss) if r.loss < 700 else math.inf
    return f"evaluation: step {r.step}, {name} loss {r.loss:.4f} (perplexity {ppl:.4g})"


def event_line(e) -> str:
    kind = e.event
    if kind == "save":
        rate = f"{e.gb_per_s:.2f} GB/s" if e.gb_per_s is not None else "rate n/a"
        waited = f"; the loop waited {e.blocking_s:.3g} s" if e.blocking_s is not None else ""
        return (f"save: step {e.step}, {size(e.gb)} in {e.seconds:.3g} s "
                f"({rate}{waited})")
    if kind == "rollback":
        return f"rollback: step {e.step} -> step {e.to_step}: {e.reason}"
    if kind in ("stop", "spike", "diverged"):
        title = {"stop": "stop", "spike": "loss spike", "diverged": "diverged"}[kind]
        return f"{title}: step {e.step}: {e.reason}"
    fields = ", ".join(f"{k}={v}" for k, v in vars(e).items() if k not in ("event", "step"))
    return f"{kind}: step {e.step}: {fields}"
