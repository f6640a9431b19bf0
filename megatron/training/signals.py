"""Signals that ask the run to checkpoint and stop at the next step boundary, and the one that
may still mean "stop now". Installed for one train(); the previous handlers are put back after it.

    SIGTERM  Slurm at the time limit and scancel, torchrun forwarding its own SIGTERM
    SIGUSR1  Slurm's warning before the time limit (--signal=USR1@S), scancel -s USR1
    SIGHUP   the terminal or ssh session went away (and torchrun forwarding it)
    SIGQUIT  Ctrl-\\ (and torchrun forwarding it)
    SIGINT   Ctrl-C: the first checkpoints and stops like the others; a second one before the
             run has stopped stops at once, without a checkpoint (KeyboardInterrupt: exit 130).
             One within REPEAT_S of the first is the same Ctrl-C arriving twice (under torchrun
             the terminal signals the workers and the agent forwards it again) and is ignored

A run stopped by a signal saves at the next step boundary, writes {"event": "stop", "reason":
"signal"} and exits 0 (the chain and checkpoint.load=auto continue from that checkpoint)."""
from __future__ import annotations

import logging
import signal
import time
from typing import Dict

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP, signal.SIGQUIT, signal.SIGINT)
REPEAT_S = 2.0


class StopFlag:
    """A context manager: `raised` turns True when a stop signal arrives; every rank learns of it
    through the loop's one small all-reduce after each step (training/agree.py)."""

    def __init__(self):
        self.raised = False
        self._first_int = None
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
        name = signal.Signals(signum).name
        if signum == signal.SIGINT:
            now = time.monotonic()
            if self._first_int is not None:
                if now - self._first_int < REPEAT_S:
                    return
                log.warning("%s again: stopping now, without a checkpoint", name)
                raise KeyboardInterrupt
            self._first_int = now
        log.warning("%s received: checkpointing and stopping after this step%s", name,
                    " (Ctrl-C again: stop now, without one)" if signum == signal.SIGINT else "")
        self.raised = True
