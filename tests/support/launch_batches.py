"""Launches shared among distributed test modules: each module that defines

    def launches(tmp) -> [(ranks, worker path, [arguments]), ...]

(in the order its jobs must run; a later job may read what an earlier one wrote under tmp) has
its jobs run in one process launch per world size together with every other such module of the
session (tests/support/shared_launch.py), instead of a launch per job: ~10-20 s of start-up
(python, torch, DeepSpeed, the rendezvous) per launch on 2 cores, each paid once per world size.
The world sizes run in the order WORLD_ORDER, in rounds: a module's jobs listed in that order
run in the first round; a job whose world size comes earlier in WORLD_ORDER than the job before
it (a checkpoint of 4 ranks continued on 2, then on 1) starts the module's next round, which
runs after every module's jobs of the round before. A round costs launches only for the world
sizes some module's jobs of it need.

A module's results are its jobs' JSON outputs merged in job order, as its own launches gave
them. A job that fails fails only its module's tests: the launch stops at it, its error (what
each rank wrote of it, then the end of the launch's stderr) goes to that module, and the jobs
after it run in a new launch. Once all have run, each failed module runs once more, whole, in
fresh directories; it fails if it fails again, and a second try that passes is named in the
session's summary.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

from tests.support.paths import ROOT
from tests.support.procs import torchrun

SUPPORT = os.path.join(ROOT, "tests", "support")
LAUNCHER = os.path.join(SUPPORT, "shared_launch.py")
WORLD_ORDER = (2, 1, 4, 8)
JOB_TIMEOUT_S = 900  # a job's share of its launch's time limit
# pytest's limit for a test of a sharing module: the first one to ask pays for every module's
# jobs in its setup (pyproject's 30 minutes is meant for one test's own work)
TIMEOUT_S = 3600


@dataclass
class Job:
    module: str
    index: int
    ranks: int
    worker: str
    argv: list
    out: str
    round: int = 0

    @property
    def name(self) -> str:
        return f"{self.module}#{self.index} ({self.worker}, {self.ranks} rank(s))"

    @property
    def done(self) -> str:
        return self.out + ".done"


@dataclass
class Batches:
    """Runs the jobs of the given modules (name -> launches function) once, on first use."""
    workdir: str
    modules: dict
    _results: dict = field(default_factory=dict)
    _errors: dict = field(default_factory=dict)
    _ran: bool = False
    _broken: str = ""
    log: list = field(default_factory=list)
    job_seconds: dict = field(default_factory=dict)  # each job done: its seconds in its launch

    def results(self, module: str) -> dict:
        if not self._ran:
            self._ran = True  # once: an error below is each module's, not a reason to rerun
            try:
                self._run_all()
            except Exception as e:
                self._broken = f"the shared launches could not run: {e!r}"
                raise
        if self._broken:
            raise AssertionError(self._broken)
        if module in self._errors:
            raise AssertionError(self._errors[module])
        return self._results[module]

    def _jobs(self, modules=None, attempt: str = "") -> list:
        """The jobs of `modules` (default all), their files under <workdir>/<module><attempt>."""
        jobs = []
        for module, launches in sorted(self.modules.items()):
            if modules is not None and module not in modules:
                continue
            tmp = os.path.join(self.workdir, module.rsplit(".", 1)[-1] + attempt)
            os.makedirs(tmp, exist_ok=True)
            rnd, last = 0, 0
            for index, (ranks, worker, argv) in enumerate(launches(tmp)):
                assert os.path.dirname(os.path.abspath(worker)) == SUPPORT, worker
                assert ranks in WORLD_ORDER, f"{module}: {ranks} ranks is not in {WORLD_ORDER}"
                if WORLD_ORDER.index(ranks) < last:
                    rnd += 1  # an earlier world size: the next round
                last = WORLD_ORDER.index(ranks)
                out = os.path.join(tmp, f"job{index}-{ranks}ranks.json")
                jobs.append(Job(module, index, ranks, os.path.basename(worker)[:-3],
                                [*argv, "--out", out], out, rnd))
        return jobs

    def _run_all(self) -> None:
        jobs = self._jobs()
        self._run_rounds(jobs)
        first = dict(self._errors)
        if first:
            # A module that failed runs once more, whole and alone, in fresh directories: 4 and 8
            # gloo ranks on 2 cores have lost a launch to something of the machine's (CI did once;
            # its cause was lost with the launch's stderr, which rank_notes now keeps). A failure that repeats fails the module with both tries' causes; one
            # that does not is said in the session's summary (conftest), never silently.
            for module in first:
                del self._errors[module]
            again = self._jobs(set(first), attempt="-try2")
            self._run_rounds(again)
            for module, error in first.items():
                if module in self._errors:
                    self._errors[module] += f"\n\nand on the first try:\n{error}"
                else:
                    self.log.append(f"{module} PASSED ONLY ON A SECOND TRY; the first: "
                                    f"{error[:3000]}")
            jobs = [j for j in jobs if j.module not in first] + again
        for job in jobs:
            if job.module in self._errors:
                continue
            with open(job.out) as f:
                self._results.setdefault(job.module, {}).update(json.load(f))

    def _run_rounds(self, jobs: list) -> None:
        for rnd in range(1 + max((j.round for j in jobs), default=0)):
            for ranks in WORLD_ORDER:
                pending = [j for j in jobs if j.ranks == ranks and j.round == rnd]
                while pending:
                    pending = self._launch(ranks, pending)

    def _launch(self, ranks: int, jobs: list) -> list:
        """Runs `jobs` in one launch; returns the jobs still to run (after a failed one)."""
        # a module whose earlier job failed runs no more of its jobs
        jobs = [j for j in jobs if j.module not in self._errors]
        if not jobs:
            return []
        spec = os.path.join(self.workdir, f"launch{len(self.log)}-{ranks}ranks.json")
        with open(spec, "w") as f:
            json.dump([{"name": j.name, "worker": j.worker, "argv": j.argv, "done": j.done}
                       for j in jobs], f, indent=1)
        timeout = JOB_TIMEOUT_S * len(jobs)
        begin = time.monotonic()
        try:
            if ranks == 1:  # a plain process, without torchrun's rendezvous
                proc = subprocess.run([sys.executable, LAUNCHER, "--jobs", spec], cwd=ROOT,
                                      capture_output=True, text=True, timeout=timeout,
                                      env=dict(os.environ, OMP_NUM_THREADS="1"))
            else:
                proc = torchrun(ranks, LAUNCHER, "--jobs", spec, timeout=timeout)
            status, stderr = f"exit {proc.returncode}", proc.stderr
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
            status, stderr = f"timed out after {timeout} s", err or ""
        self.log.append(f"{ranks} rank(s), {len(jobs)} job(s): {time.monotonic() - begin:.0f} s")
        self.job_seconds.update({j.name: float(open(j.done).read()) for j in jobs
                                 if os.path.exists(j.done)})
        for i, job in enumerate(jobs):
            if not os.path.exists(job.done):
                self._errors[job.module] = f"{job.name} failed (launch {status}):\n" \
                                           f"{_rank_notes(spec, ranks)}{stderr[-5000:]}"
                return jobs[i + 1:]
        if status != "exit 0":  # every job done, yet the launch failed (at its exit)
            for job in jobs:
                self._errors[job.module] = f"{job.name}'s launch failed after every job was " \
                                           f"done ({status}):\n{stderr[-5000:]}"
        return []


def _rank_notes(spec: str, ranks: int) -> str:
    """What each rank of the launch of `spec` wrote of its failure (shared_launch.rank_notes:
    the traceback that ended it, or its stack when the launcher ended it), ahead of the
    launcher's interleaved stderr, whose end alone may not name the first cause."""
    said = []
    for rank in range(ranks):
        path = f"{spec}.rank{rank}.txt"
        text = open(path).read().strip() if os.path.exists(path) else ""
        if text:
            said.append(f"--- rank {rank} ---\n{text[-3000:]}\n")
    return "".join(said) + ("--- the launch's stderr ---\n" if said else "")
