"""Signals that ask the run to checkpoint and stop at the next step boundary: SIGTERM (what
Slurm and torchrun send first) and SIGUSR1 (Slurm's warning before the time limit, with
--signal). The handlers are installed for one train() and the previous ones put back after it."""
from __future__ import annotations

import logging
import signal
from typing import Dict

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopFlag:
    """A context manager: `raised` turns True when a stop signal arrives; every rank learns of it
    through the loop's one small all-reduce after each step (training/agree.py)."""

    def __init__(self):
        self.raised = False
        self._previous: Dict[int, object] = {}

    def __enter__(self) -> "StopFlag":
        for sig in STOP_SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread (tests driving train() from a thread)
                pass
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handler(self, signum, frame):
        log.warning("signal %d received: checkpointing and stopping after this step", signum)
        self.raised = True
