"""The hang watchdog: a thread on every rank that ends the rank when it stays in one phase past
that phase's limit, after saying where it was.

A rank stuck in a collective (a peer stopped, a dead link, a broadcast two ranks never reach)
waits for the process group's timeout, which must be long enough for the rendezvous of thousands
of ranks, and then dies with a bare backend traceback. The watchdog gives each phase its own
limit instead: training.startup_timeout_minutes for start-up (rendezvous, model) and for the first
phase of each kind (the first step, save, evaluation, load); after that, the larger of
training.hang_timeout_minutes and FACTOR times the slowest completed phase of the same kind.
Past it, the rank writes every thread's Python stack to <run.dir>/hangs/rank<N>.txt, appends
{"event": "hang", rank, host, phase, ...} to metrics.jsonl and exits EXIT_HANG, so srun
--kill-on-bad-exit or torchrun ends the whole job, and the chain submits the next one.

The loop's cost is two attribute writes per phase; the thread wakes every POLL_S seconds."""
from __future__ import annotations

import faulthandler
import json
import logging
import os
import socket
import sys
import threading
import time
from typing import Dict, Optional

from megatron.checkpoint.records import HangEvent, record_json
from megatron.checkpoint.rundir import RunDir

log = logging.getLogger(__name__)

EXIT_HANG = 4
FACTOR = 5.0
POLL_S = 1.0


class Watchdog:
    """A context manager around one train(); enter(phase) and done() from the loop."""

    def __init__(self, run: RunDir, rank: int, startup_s: float, floor_s: float,
                 poll_s: float = POLL_S, exit=os._exit):
        """startup_s / floor_s: the limits in seconds (0 turns the watchdog off). exit: how the
        rank ends (os._exit: a hung main thread cannot run a clean exit)."""
        self.run, self.rank, self.host = run, rank, socket.gethostname()
        self.startup_s, self.floor_s, self.poll_s, self._exit = startup_s, floor_s, poll_s, exit
        self.phase: Optional[str] = "start-up"
        self.since = time.monotonic()
        self.step = 0
        self.longest: Dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def on(self) -> bool:
        return self.startup_s > 0 or self.floor_s > 0

    def __enter__(self) -> "Watchdog":
        if self.on:
            self._thread = threading.Thread(target=self._watch, name="hang-watchdog",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def enter(self, phase: str, step: Optional[int] = None) -> None:
        if step is not None:
            self.step = step
        self.phase, self.since = phase, time.monotonic()

    def done(self) -> None:
        """Closes the current phase and remembers how long it took."""
        phase, took = self.phase, time.monotonic() - self.since
        if phase is not None and took > self.longest.get(phase, 0.0):
            self.longest[phase] = took
        self.phase = None

    def limit(self, phase: str) -> float:
        """Seconds this phase may take now (0: no limit). A kind of phase not yet completed
        once (start-up, the first step, the first save, evaluation or load) gets start-up's
        allowance: at scale those take minutes, and nothing measured says how many."""
        if phase not in self.longest:
            return self.startup_s
        if self.floor_s <= 0:
            return 0.0
        return max(self.floor_s, FACTOR * self.longest[phase])

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            phase, since = self.phase, self.since
            if phase is None:
                continue
            limit, seconds = self.limit(phase), time.monotonic() - since
            if limit and seconds > limit:
                self._fire(phase, seconds, limit)
                return

    def _fire(self, phase: str, seconds: float, limit: float) -> None:
        event = HangEvent(self.step, self.rank, self.host, phase, round(seconds, 1), limit)
        where = os.path.join(self.run.hangs, f"rank{self.rank:05d}.txt")
        try:
            os.makedirs(self.run.hangs, exist_ok=True)
            with open(where, "w") as f:
                f.write(f"rank {self.rank} on {self.host}: {phase} of step {self.step} ran "
                        f"{seconds:.1f} s, past its {limit:.1f} s limit\n\n")
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
            # One write with O_APPEND: whole beside the lines rank 0 may be writing.
            fd = os.open(self.run.metrics, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (json.dumps(record_json(event)) + "\n").encode())
            finally:
                os.close(fd)
        except OSError as e:
            where = f"(not written: {e})"
        sys.stderr.write(f"megatron-train: error: rank {self.rank} on {self.host} hung: {phase} "
                         f"of step {self.step} ran {seconds:.1f} s, past its {limit:.1f} s limit "
                         f"(training.hang_timeout_minutes, startup_timeout_minutes); every "
                         f"thread's stack is in {where}; exiting {EXIT_HANG} so the job ends\n")
        sys.stderr.flush()
        self._exit(EXIT_HANG)
