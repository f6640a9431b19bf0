"""The run guards itself: a non-finite loss, or too many consecutive skipped steps, stops it
before a diverged state can be committed; a loss spike far above its running median is logged,
and can stop the run or roll it back to the last checkpoint past the batches that caused it.

Skipped steps are counted by cause: under fp16 a skip is the loss scaler backing off after an
overflow (normal, in bursts), otherwise it means the gradients were not finite."""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

OK, ROLLBACK, STOP = 0, 1, 2  # ordered: the loop agrees on the largest over ranks


@dataclass
class Verdict:
    action: int = OK
    reason: str = ""
    spike: bool = False


class DivergenceGuard:
    def __init__(self, r, fp16: bool):
        """r: the resilience section (its limits and spike policy); fp16: skips are loss-scale
        overflows."""
        self.r, self.fp16 = r, fp16
        self.skips = 0
        self.history: deque = deque(maxlen=r.loss_spike_window)

    def observe(self, step: int, loss: float, skipped: bool) -> Verdict:
        if not math.isfinite(loss):
            return Verdict(STOP, f"step {step}: the loss is {loss}")
        verdict = self._skips(step, skipped)
        if verdict.action != OK or skipped:
            return verdict
        return self._spike(step, loss)

    def _skips(self, step: int, skipped: bool) -> Verdict:
        self.skips = self.skips + 1 if skipped else 0
        limit = self.r.max_loss_scale_skips if self.fp16 else self.r.max_skipped_steps
        if self.skips <= limit:
            return Verdict()
        what = ("steps skipped for fp16 loss-scale overflows (resilience.max_loss_scale_skips="
                if self.fp16 else "steps skipped for non-finite gradients "
                "(resilience.max_skipped_steps=")
        return Verdict(STOP, f"step {step}: {self.skips} consecutive {what}{limit})")

    def suspicious(self, loss: float) -> bool:
        """Whether observe() would call this loss non-finite or a spike; counts nothing
        (training/sdc.py asks before the step's update)."""
        return not math.isfinite(loss) or self._median_below(loss) is not None

    def _median_below(self, loss: float):
        """The running median when `loss` is a spike above it, else None."""
        factor = self.r.loss_spike_factor
        if factor and len(self.history) >= min(10, self.history.maxlen):
            median = statistics.median(self.history)
            if loss > factor * median:
                return median
        return None

    def _spike(self, step: int, loss: float) -> Verdict:
        median = self._median_below(loss)
        if median is not None:
            action = {"log": OK, "stop": STOP, "rollback": ROLLBACK}[self.r.loss_spike_action]
            return Verdict(action, f"step {step}: loss {loss:.4f} is above "
                           f"{self.r.loss_spike_factor:g} x its running median {median:.4f} "
                           f"(resilience.loss_spike_factor)", spike=True)
        self.history.append(loss)
        return Verdict()

    def rolled_back(self) -> None:
        self.skips = 0
