"""Start-up phases of a run, timed from the launch of this rank's process to its first step.

A job of thousands of ranks waits for the slowest rank's start-up on every launch, so the loop
logs where that time went (imports, process group, DeepSpeed, model, data, ...), and writes it
into the first metrics line. Standard library only: the entry points read the clock before
torch is imported."""
from __future__ import annotations

import os
import time
from typing import Dict, List, Optional, Tuple


def process_start_time() -> Optional[float]:
    """Unix time at which this process was started (Linux /proc, 10 ms resolution), or None.

    /proc/self/stat gives the start in clock ticks since boot and /proc/uptime the seconds since
    boot, so their difference is the process's age; /proc/stat's btime would be whole seconds."""
    try:
        with open("/proc/self/stat") as f:
            # The command name (field 2) may hold spaces; the fields after it are plain numbers.
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        now = time.time()
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
    except (OSError, ValueError, IndexError):
        return None
    return now - age if 0.0 <= age < 10 * 24 * 3600 else None


class StartupTimer:
    """Phases in order, each the wall time since the previous mark (or since the process
    started, for the first one)."""

    def __init__(self, started: Optional[float] = None):
        """started: Unix time the phases count from; default this process's start (or now,
        where /proc cannot tell)."""
        self.origin = started if started is not None else (process_start_time() or time.time())
        self.last = self.origin
        self.phases: List[Tuple[str, float]] = []

    def mark(self, name: str, at: Optional[float] = None) -> None:
        """Closes the phase `name` at `at` (default now); marks of the same name add up."""
        at = time.time() if at is None else at
        seconds = max(0.0, at - self.last)
        self.last = max(self.last, at)
        for i, (old, value) in enumerate(self.phases):
            if old == name:
                self.phases[i] = (name, value + seconds)
                return
        self.phases.append((name, seconds))

    @property
    def total(self) -> float:
        return self.last - self.origin

    def record(self) -> Dict[str, object]:
        """For metrics.jsonl: {"total_s", "phases": {name: seconds}, "first_step_at"}."""
        return {"total_s": round(self.total, 3),
                "phases": {name: round(s, 3) for name, s in self.phases},
                "first_step_at": round(self.last, 3)}

    def text(self) -> str:
        parts = ", ".join(f"{name} {s:.2f}" for name, s in self.phases if s >= 0.005)
        return f"{self.total:.2f} s from launch to the first step ({parts})"
