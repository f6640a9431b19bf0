"""When the loop saves and stops on its own: wall-clock saves (checkpoint.save_interval_minutes) and
the job's deadline (training.exit_duration_minutes, or the batch job's end time), so a job
commits a checkpoint and exits 0 while there is still time, whatever the signal margin.

Rank 0's clock decides; the loop agrees every decision in the one all-reduce it already makes
per step (training/agree.py)."""
from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from typing import Mapping, Optional

from megatron.config.errors import InputError, ascii_float

log = logging.getLogger(__name__)

# Batch scripts export the job's end (Unix seconds); SLURM_JOB_END_TIME where Slurm sets it.
END_TIME_VARS = ("MEGATRON_JOB_END_TIME", "SLURM_JOB_END_TIME")
# Room kept beyond the estimates: steps and saves vary (other jobs on the file system).
SAFETY = 1.2


class SaveClock:
    """checkpoint.save_interval_minutes: due when that much wall clock passed since the last save."""

    def __init__(self, minutes: float):
        self.seconds, self.last = minutes * 60.0, time.monotonic()

    def due(self) -> bool:
        return self.seconds > 0 and time.monotonic() - self.last >= self.seconds

    def saved(self) -> None:
        self.last = time.monotonic()


def job_end(minutes: float, environ: Mapping[str, str], started: float):
    """(Unix time the run must be done by, what set it), or (None, None): the earliest of
    exit_duration_minutes after `started` and the batch job's end time."""
    found = []
    if minutes > 0:
        found.append((started + 60.0 * minutes, f"training.exit_duration_minutes={minutes:g}"))
    for var in END_TIME_VARS:
        value = environ.get(var, "").strip()
        if not value:
            continue
        try:
            at = ascii_float(value)
        except ValueError:
            at = float("nan")
        if math.isfinite(at):  # nan compared false with every time: the run never stopped
            found.append((at, f"{var}={value}"))
        else:
            raise InputError(f"{var}={value!r} is not a time: expected the job's end in Unix "
                             f"seconds (e.g. $(date -d \"$END\" +%s)); unset it to run without "
                             "a deadline")
    return min(found) if found else (None, None)


class Deadline:
    """Stops the run once the time left would not hold another step and a save."""

    def __init__(self, minutes: float, started: float, environ: Optional[Mapping[str, str]] = None,
                 now=time.time, reserve: float = 0.0):
        """started: when the run began (Unix time), from which exit_duration_minutes counts;
        reserve: seconds kept free after the last save for the exit (exit_reserve_seconds)."""
        self.now, self.reserve = now, reserve
        self.at, self.source = job_end(minutes, os.environ if environ is None else environ,
                                       started)
        self.steps: deque = deque(maxlen=8)
        self.save: Optional[float] = None
        self.expected_save: Optional[float] = None  # before this job has saved (expect_save)
        self.in_flight = 0.0  # seconds a save in flight may still need (asynchronous saves)
        if self.at is not None:
            log.info("the run stops with a checkpoint before %s (%s)",
                     time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.at)), self.source)

    def step_took(self, seconds: float, growth: float = 1.0) -> None:
        """growth: the next step's batch over this one's (a batch-size ramp's next, larger step
        takes that much longer), so the room kept is the next step's."""
        self.steps.append(seconds * growth)

    def save_took(self, seconds: float) -> None:
        self.save = seconds if self.save is None else max(self.save, seconds)

    def expect_save(self, seconds: float, source: str) -> None:
        """What a save should take before this job has saved one: the run's last saves, or an
        estimate from the checkpoint's size and the disk's write speed."""
        self.expected_save = seconds
        if self.at is not None:
            log.info("until this job has saved, a save is taken to need %.1f s (%s)", seconds,
                     source)

    def save_estimate(self) -> float:
        """Seconds a save takes: the slowest this job made, else expect_save's, else a step's."""
        save = self.save if self.save is not None else self.expected_save
        if save is not None:
            return save
        return max(self.steps) if self.steps else 0.0

    def needed(self) -> float:
        """Seconds one more step, the wait for a save still in flight, and a save take, with
        room (the slowest recent step; a save as save_estimate says), and then the exit."""
        return SAFETY * (max(self.steps) + self.in_flight + self.save_estimate()) + self.reserve

    def reached(self) -> bool:
        if self.at is None or not self.steps:
            return False
        return self.now() + self.needed() >= self.at

    def reason(self) -> str:
        flight = " (and the save in flight)" if self.in_flight else ""
        exit_ = f" and {self.reserve:g} s kept for the exit" if self.reserve else ""
        return (f"{self.at - self.now():.1f} s left before the deadline ({self.source}), "
                f"one more step and a save{flight}{exit_} need about {self.needed():.1f} s")
