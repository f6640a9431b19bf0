"""The hang watchdog: a thread on every rank that ends the rank when it stays in one phase past
that phase's limit, after saying where it was.

A rank stuck in a collective (a peer stopped, a dead link, a broadcast two ranks never reach)
waits for the process group's timeout, which must be long enough for the rendezvous of thousands
of ranks, and then dies with a bare backend traceback. The watchdog gives each phase its own
limit instead: resilience.startup_timeout_minutes for start-up (rendezvous, model) and for the first
phase of each kind (the first step, evaluation, load); after that, the larger of
resilience.hang_timeout_minutes and FACTOR times the slowest completed phase of the same kind. A
save's limit follows what a save costs (expect()): the larger of hang_timeout_minutes and FACTOR
times the slowest of the last saves (start to commit, the background write included), or, before
the job's first, times the checkpointer's estimate, so a stuck first save is named within minutes
and a slow but healthy asynchronous save is not taken for a hang.
Past it, the rank writes every thread's Python stack to <run.dir>/hangs/<job>/rank<N>.txt,
appends {"event": "hang", rank, host, phase, ...} to metrics.jsonl, waits a grace period for the
other ranks to report, and exits EXIT_HANG, so srun --kill-on-bad-exit or torchrun ends the
whole job, and the chain submits the next one.

A rank that is itself stopped (SIGSTOP, a dead node, stuck outside the collective the others wait
in) cannot report. After the grace period the first reporting rank to claim the job's summary
names the ranks that never reported: {"event": "unresponsive", ranks, nodes}, and their nodes go
into <run.dir>/bad_nodes, which the job chain leaves out of the next job.

Once the roster is known (join()), the process groups' own timeout follows the limit of the phase
being entered plus MARGIN_S: minutes for the rendezvous and the first step and save, the steady
limit after; the watchdog, which says where, fires first, and the backend's timeout is the
backstop when the watchdog thread itself cannot run.

The phases: step, agreement, guard (the divergence guard's action), evaluation, after-step (the
checkpointer's decision), and save and load, which the checkpointer enters only when a save or a
load really happens, so a load and a save are timed against their own cost, however many steps
came before them.

The loop's cost is a few attribute writes and one comparison per phase; the thread wakes every
POLL_S seconds."""
from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Callable, Dict, List, Optional

from megatron.base.records import HangEvent, UnresponsiveEvent, record_json
from megatron.config.errors import ascii_digits
from megatron.base.rundir import RunDir

log = logging.getLogger(__name__)

EXIT_HANG = 4
FACTOR = 5.0
POLL_S = 1.0
MARGIN_S = 60.0  # the process groups' timeout above the watchdog's limit


def grace_s(limit: float) -> float:
    """How long a rank that fired waits for the others to report before it exits (they wait in
    the same collective, entered a little apart): 10-60 s, a tenth of the limit between."""
    return min(60.0, max(10.0, 0.1 * limit))


def job_stamp(unix_time: float) -> str:
    """A job's name among the run's hang folders: rank 0's start time, UTC, to the second (the
    run's lock keeps two jobs of one run from starting together)."""
    return "job-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(unix_time))


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
        self.expected: Dict[str, float] = {}  # what a phase should cost (expect())
        self.job, self.nodes = job_stamp(time.time()), None  # this rank's own until join()
        self._collectives: Optional[Callable[[float], object]] = None
        self._base_s = self._applied_s = 0.0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._stop_at = _stop_at(os.environ.get("MEGATRON_TEST_STOP_AT"), rank)

    def join(self, nodes: List[str], started: float,
             collectives: Optional[Callable[[float], object]] = None,
             base_s: float = 0.0) -> None:
        """After the rendezvous: every rank's node (by rank) and rank 0's start time, which names
        the job's hang folder alike on every rank. collectives(seconds) sets the process
        groups' timeout, which is base_s (parallel.timeout_minutes) now and where a phase has
        no limit."""
        self.nodes, self.job = list(nodes), job_stamp(started)
        if self.on and collectives is not None:
            self._collectives = collectives
            self._base_s = self._applied_s = base_s

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
        if self._stop_at is not None and self._stop_at == (self.step, phase):
            os.kill(os.getpid(), signal.SIGSTOP)  # the test's hung rank, at a seeded point
        if self._collectives is not None:
            limit = self.limit(phase)
            wanted = limit + MARGIN_S if limit else self._base_s
            if wanted != self._applied_s:
                self._collectives(wanted)
                self._applied_s = wanted

    def done(self) -> None:
        """Closes the current phase and remembers how long it took."""
        phase, took = self.phase, time.monotonic() - self.since
        if phase is not None and took > self.longest.get(phase, 0.0):
            self.longest[phase] = took
        self.phase = None

    def expect(self, phase: str, seconds: float) -> None:
        """What a phase should cost, known before it runs: for a save, the slowest of the last
        saves measured from start to commit, else the estimate of an unmeasured one
        (training/checkpointer.py). Its limit is then FACTOR times that (at least the floor)
        from its first run on, and an asynchronous save's commit, which waits for the writer,
        is held to the whole save's cost, not to the short phase that started it."""
        self.expected[phase] = seconds

    def limit(self, phase: str) -> float:
        """Seconds this phase may take now (0: no limit). A kind of phase not yet completed
        once and with no expected cost (start-up, the first step, evaluation or load) gets
        start-up's allowance: at scale those take minutes, and nothing measured says how many."""
        expected = self.expected.get(phase)
        if phase not in self.longest and expected is None:
            return self.startup_s
        if self.floor_s <= 0:
            return 0.0 if phase in self.longest else self.startup_s
        return max(self.floor_s, FACTOR * max(self.longest.get(phase, 0.0), expected or 0.0))

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
        where = self.run.hang_stacks(self.job, self.rank)
        try:
            os.makedirs(os.path.dirname(where), exist_ok=True)
            with open(where, "w") as f:
                f.write(f"rank {self.rank} on {self.host}: {phase} of step {self.step} ran "
                        f"{seconds:.1f} s, past its {limit:.1f} s limit\n\n")
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
            _append_line(self.run.metrics, record_json(event))
        except OSError as e:
            where = f"(not written: {e})"
        sys.stderr.write(f"megatron-train: error: rank {self.rank} on {self.host} hung: {phase} "
                         f"of step {self.step} ran {seconds:.1f} s, past its {limit:.1f} s limit "
                         f"(resilience.hang_timeout_minutes, startup_timeout_minutes); every "
                         f"thread's stack is in {where}; exiting {EXIT_HANG} so the job ends\n")
        sys.stderr.flush()
        if self.nodes is not None and len(self.nodes) > 1:
            self._stop.wait(grace_s(limit))
            self._name_the_silent(phase)
        self._exit(EXIT_HANG)

    def _name_the_silent(self, phase: str) -> None:
        """The first rank past its grace period claims the job's summary (O_EXCL) and names the
        ranks without a stacks file; the others wait for it to be written, then exit too."""
        summary = self.run.hang_summary(self.job)
        try:
            fd = os.open(summary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            _wait_for_content(summary, 10.0)
            return
        except OSError:
            return
        try:
            folder = os.path.dirname(summary)
            reported = {int(n[4:-4]) for n in os.listdir(folder)
                        if n.startswith("rank") and n.endswith(".txt") and ascii_digits(n[4:-4])}
            silent = [r for r in range(len(self.nodes)) if r not in reported]
            nodes = list(dict.fromkeys(self.nodes[r] for r in silent))
            text = self._summary_text(phase, silent, len(reported))
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        sys.stderr.write(f"megatron-train: error: {text}")
        if not silent:
            return
        _append_line(self.run.metrics, record_json(UnresponsiveEvent(
            self.step, silent, nodes, phase, len(reported))))
        for node in nodes:
            ranks = [r for r in silent if self.nodes[r] == node]
            self.run.add_bad_node(node, f"rank(s) {_ranks(ranks)} stopped answering in step "
                                        f"{self.step}: the others waited in {phase} past its "
                                        "limit (hang watchdog)")

    def _summary_text(self, phase: str, silent: List[int], reported: int) -> str:
        if not silent:
            return (f"all {reported} ranks hung in step {self.step} ({phase} and its "
                    "like): a collective some rank never reached, not a node; see the stacks in "
                    f"{os.path.dirname(self.run.hang_summary(self.job))}\n")
        named = ", ".join(f"{r} ({self.nodes[r]})" for r in silent[:16])
        more = f" and {len(silent) - 16} more" if len(silent) > 16 else ""
        return (f"in step {self.step}, {reported} rank(s) waited in {phase} past its limit; "
                f"rank(s) {named}{more} never reported (stopped, dead or stuck outside the "
                f"collective): their node(s) are named in {self.run.bad_nodes}, which the job "
                "chain leaves out of the next job\n")


def _stop_at(value: Optional[str], rank: int):
    """The test hook MEGATRON_TEST_STOP_AT=RANK:STEP:PHASE: that rank stops itself (SIGSTOP) on
    entering that phase of that step; (step, phase) for this rank, else None."""
    if not value:
        return None
    try:
        who, step, phase = value.split(":")
        return (int(step), phase) if int(who) == rank else None
    except ValueError:
        raise ValueError(f"MEGATRON_TEST_STOP_AT={value!r}: expected RANK:STEP:PHASE, e.g. "
                         "1:7:step") from None


def _ranks(ranks: List[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def _append_line(path: str, obj) -> None:
    """One write with O_APPEND: whole beside the lines rank 0 may be writing."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(obj) + "\n").encode())
    finally:
        os.close(fd)


def _wait_for_content(path: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if os.path.getsize(path) > 0:
                return
        except OSError:
            return
        time.sleep(0.2)
