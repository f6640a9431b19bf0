"""Chained Slurm jobs: a training longer than one job's time limit is a series of batch jobs, each
continuing from the newest complete checkpoint (checkpoint.load=auto) on the node count it was
given, each submitting the next one until training.train_iters is reached.

A chain stops when the run is finished, after MEGATRON_CHAIN_MAX_ATTEMPTS jobs, or when a job
left the newest complete checkpoint where it found it (no progress) and trying again would not
help: it exited 0 (a time limit too short for one save), or with a status the next job would
repeat (2: a bad config or input, a run directory locked by another run; 3: diverged), or it is
the MEGATRON_CHAIN_MAX_FAILURES-th (3) such failure in a row. A job that failed before its first
checkpoint otherwise (a node lost at start-up, a hang, a killed rank) is submitted again.
Progress is the step of the newest checkpoint that validates, the same one the next job would
continue from (megatron.base.rundir.RunDir.continuation), so a job that trained steps it
could not commit made none. Each decision is one line in the job's output and in
<run.dir>/chain.log. Nodes that failed their health check (launch/health.py), whose rank
stopped answering (training/watchdog.py), or whose task died first (below), all listed in
<run.dir>/bad_nodes, are left out of every later job (sbatch --exclude), up to
MEGATRON_CHAIN_MAX_EXCLUDED (8) of them, and never so many that the partition's usable nodes
(sinfo) could no longer hold the job: then the newest exclusions are dropped for that job, and
the decision says so. Ask for a few more nodes than the layout needs (spares), and the chain keeps
the job's node count.

Which nodes those are, from srun's stderr and the partition's size: training/chain_nodes.py.

examples/frontier/chain.sh wraps its command line (megatron/cli/chain.py) for batch scripts:

    python -m megatron.cli.chain status --config C [--set k=v ...]
    python -m megatron.cli.chain begin  --config C [--set k=v ...]
    python -m megatron.cli.chain end    --start-step S --exit-status RC --submit-env FILE \\
        --config C [--set k=v ...] -- BATCH SCRIPT ARGUMENTS

begin (before the training step) prints `train START` or `stop START`; end (after it) submits
the batch script again with the same arguments, behind the running job (afterany), from the
environment the job was submitted with. This is job orchestration, above the trainer, so it
lives with the loop in megatron.training; nothing here prints or exits."""
from __future__ import annotations

import logging
import os
import shlex
import subprocess
from dataclasses import dataclass, replace
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from megatron.base import store
from megatron.base.rundir import RunDir
from megatron.config.errors import InputError, ascii_digits
from megatron.training.chain_nodes import (MAX_EXCLUDED, first_exit_status, plan_exclusions,
                                           read_srun_log, record_dead_nodes, usable_nodes)

log = logging.getLogger(__name__)

DEFAULT_MAX_ATTEMPTS = 20
DEFAULT_MAX_FAILURES = 3
DEFAULT_MAX_EXCLUDED = 8
ENABLE, ATTEMPT, MAX_ATTEMPTS, SCRIPT, FAILURES, MAX_FAILURES = (
    "MEGATRON_CHAIN", "MEGATRON_CHAIN_ATTEMPT", "MEGATRON_CHAIN_MAX_ATTEMPTS",
    "MEGATRON_CHAIN_SCRIPT", "MEGATRON_CHAIN_FAILURES", "MEGATRON_CHAIN_MAX_FAILURES")
# Exit statuses of megatron-train that the same job would repeat: a bad config or input (2), a
# run that stopped itself on divergence (3). Anything else is taken for the machine's failure.
REPEATS = {2: "a configuration or input error", 3: "the run diverged"}
SRUN_LOG = "MEGATRON_CHAIN_SRUN_LOG"


@dataclass(frozen=True)
class Progress:
    run_dir: str
    step: int  # of the newest complete checkpoint; 0 when there is none
    train_iters: int
    skipped: Tuple[str, ...] = ()  # newer step_N folders that do not validate, why

    @property
    def finished(self) -> bool:
        return self.step >= self.train_iters


def progress(run_dir: str, train_iters: int) -> Progress:
    c = RunDir(run_dir).continuation()
    return Progress(run_dir, c.step, train_iters, c.skipped)


@dataclass(frozen=True)
class Settings:
    """The chain's knobs, from the job's environment (and checkpoint.save, which must be on)."""
    enabled: bool
    attempt: int  # 1 for the job a person submitted, n+1 for the job job n submitted
    max_attempts: int
    off_reason: str = ""
    failures: int = 0  # jobs in a row before this one that failed without progress
    max_failures: int = DEFAULT_MAX_FAILURES
    job: Optional["JobFacts"] = None  # inside a Slurm job: what `end` needs to know of it


@dataclass(frozen=True)
class JobFacts:
    """This job, for `end`: its id, srun's stderr (chain.sh), its partition and node count (the
    next job's, too) and the bound on excluded nodes."""
    job_id: str
    srun_log: str = ""
    partition: str = ""
    nodes: int = 0
    max_excluded: int = DEFAULT_MAX_EXCLUDED


def job_facts(env: Mapping[str, str]) -> Optional[JobFacts]:
    if "SLURM_JOB_ID" not in env:
        return None
    nodes = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or ""
    return JobFacts(env["SLURM_JOB_ID"], env.get(SRUN_LOG, ""), env.get("SLURM_JOB_PARTITION", ""),
                    int(nodes) if ascii_digits(nodes) else 0,
                    _count(env, MAX_EXCLUDED, DEFAULT_MAX_EXCLUDED))


def settings(env: Mapping[str, str], final_save: bool = True) -> Settings:
    attempt = _count(env, ATTEMPT, 1)
    most = _count(env, MAX_ATTEMPTS, DEFAULT_MAX_ATTEMPTS)
    failed = _count(env, FAILURES, 0, least=0)
    most_failed = _count(env, MAX_FAILURES, DEFAULT_MAX_FAILURES)
    flag = env.get(ENABLE, "1").strip().lower()
    if flag not in ("0", "1", "no", "yes", "off", "on", "false", "true"):
        raise InputError(f"{ENABLE}={env[ENABLE]!r} is invalid: expected 1 (chain jobs, the "
                         f"default) or 0 (one job, no resubmission)")
    if flag in ("0", "no", "off", "false"):
        return Settings(False, attempt, most, f"chaining is off ({ENABLE}={env[ENABLE]})",
                        failed, most_failed)
    if not final_save:
        return Settings(False, attempt, most, "chaining is off: checkpoint.save=false, so the "
                        "end of the run leaves no checkpoint to tell the chain it finished "
                        "(set checkpoint.save=true)", failed, most_failed)
    if "SLURM_JOB_ID" not in env:
        return Settings(False, attempt, most, "chaining is off: not inside a Slurm job", failed,
                        most_failed)
    return Settings(True, attempt, most, "", failed, most_failed, job_facts(env))


def _count(env: Mapping[str, str], name: str, default: int, least: int = 1) -> int:
    text = env.get(name, "").strip()
    if not text:
        return default
    if not ascii_digits(text) or int(text) < least:
        raise InputError(f"{name}={env[name]!r} is invalid: expected a whole number >= {least}")
    return int(text)


@dataclass(frozen=True)
class Decision:
    go: bool  # begin: train in this job; end: submit the next one
    message: str
    failures: int = 0  # end: the next job's MEGATRON_CHAIN_FAILURES


def _where(p: Progress) -> str:
    return f"{p.run_dir}: step {p.step} of training.train_iters={p.train_iters}"


def rollback_start(p: Progress, load: Optional[str], roll_back: bool) -> Progress:
    """begin's view of a job that rolls back (checkpoint.roll_back with checkpoint.load naming
    a checkpoint below the run's newest, or a fresh start): it starts from that step, so neither
    `finished` nor the progress `end` judges is read from the checkpoints it moves aside. A load
    that does not validate is left to the trainer's message."""
    if not roll_back or load == "auto":
        return p
    step = 0
    if load is not None:
        try:
            if os.path.isfile(os.path.join(load, store.META)):
                step = store.validate(load).step
            else:
                found, _ = store.newest_complete(load)
                if found is None:
                    return p
                step = found.step
        except (store.Incomplete, OSError):
            return p
    return replace(p, step=min(step, p.step))


def begin(p: Progress, s: Settings) -> Decision:
    """Before training: in a chain, a finished run trains no more (a person submitting it
    again, or a job submitted by hand behind the chain's last one)."""
    if not s.enabled:
        return Decision(True, f"{_where(p)}; {s.off_reason}")
    if p.finished:
        return Decision(False, f"{_where(p)}: the run is finished, nothing to train")
    start = f"continuing from step {p.step}" if p.step else "starting (no checkpoint yet)"
    return Decision(True, f"job {s.attempt} of at most {s.max_attempts} "
                          f"({MAX_ATTEMPTS}): {p.run_dir}: {start}, "
                          f"training.train_iters={p.train_iters}")


def end(p: Progress, start_step: int, exit_status: int, s: Settings) -> Decision:
    """After training: submit the next job if this one moved the newest complete checkpoint
    forward, or if it failed before it could (a node lost, a hang before the first save) fewer
    than max_failures times in a row; within the bound on jobs, and never after a failure the
    next job would repeat (REPEATS) or a clean exit without progress."""
    if p.finished:
        jobs = f" after {s.attempt} job(s) of this chain" if s.enabled else ""
        return Decision(False, f"{_where(p)}: the run is finished{jobs}")
    if not s.enabled:
        return Decision(False, f"{_where(p)}; {s.off_reason}: not submitting the next job")
    srun_stderr = read_srun_log(s.job) if exit_status != 0 and s.job is not None else None
    if srun_stderr is not None:
        record_dead_nodes(p.run_dir, s.job, srun_stderr)
        first = first_exit_status(srun_stderr)
        if first in REPEATS:  # srun's status is the task it ended: the first one's says why
            exit_status = first
    failures = 0
    if p.step <= start_step:
        stop = _no_progress(p, start_step, exit_status, s)
        if stop is not None:
            return stop
        failures = s.failures + 1
    if s.attempt >= s.max_attempts:
        return Decision(False, f"{_where(p)}: this was job {s.attempt} of at most "
                               f"{s.max_attempts} ({MAX_ATTEMPTS}): not submitting the next "
                               "job. Submit again to continue (the count starts over)")
    why = (f"this job trained from step {start_step}" if not failures else
           f"no progress in this job, failure {failures} of at most {s.max_failures} in a row "
           f"({MAX_FAILURES}): trying again")
    try:
        note = _exclusion_note(p, s)
    except InputError as e:  # more bad nodes than MEGATRON_CHAIN_MAX_EXCLUDED
        return Decision(False, f"{_where(p)}: {e}")
    return Decision(True, f"{_where(p)} ({why}, exit status {exit_status}): submitting job "
                          f"{s.attempt + 1}{note}", failures)


def _no_progress(p: Progress, start_step: int, exit_status: int, s: Settings
                 ) -> Optional[Decision]:
    """The stop for a job that left the newest checkpoint where it was, or None to try again."""
    head = (f"{_where(p)}: no progress in this job (it started from step {start_step}; exit "
            f"status {exit_status}): not submitting the next job")
    if exit_status == 0:
        return Decision(False, f"{head}. It ended cleanly without a checkpoint (a time limit "
                               "too short for one save?); fix the cause, then submit again")
    if exit_status in REPEATS:
        return Decision(False, f"{head}: {REPEATS[exit_status]} fails the same way again. Fix "
                               "the cause (see above in this log), then submit again")
    if s.failures + 1 >= s.max_failures:
        return Decision(False, f"{head}: {s.failures + 1} jobs in a row failed without progress "
                               f"({MAX_FAILURES}={s.max_failures}). Fix the cause (see above in "
                               "this log), then submit again")
    return None


def excluded_nodes(bad: Sequence[str], env: Mapping[str, str]) -> List[str]:
    """The nodes the next job leaves out (plan_exclusions, with this job's partition from sinfo)."""
    job = job_facts(env) or JobFacts("", max_excluded=_count(env, MAX_EXCLUDED,
                                                             DEFAULT_MAX_EXCLUDED))
    return plan_exclusions(bad, job, usable_nodes(job.partition) if job.nodes else None)[0]


def _exclusion_note(p: Progress, s: Settings) -> str:
    """What end's decision says about the next job's exclusions: the nodes left out, and those
    the partition's size forbids leaving out."""
    if s.job is None:
        return ""
    bad = RunDir(p.run_dir).read_bad_nodes()
    if not bad:
        return ""
    keep, note = plan_exclusions(bad, s.job, usable_nodes(s.job.partition) if s.job.nodes
                                 else None)
    said = f", leaving out {', '.join(keep)} (bad_nodes)" if keep else ""
    return f"{said}; {note}" if note else said


# --- The next job: its sbatch command line and environment ------------------------------------

# squeue's fields for the job's own submission options; %o (the command) last, since it may
# hold anything. Unit separator between fields: it appears in no name or path.
SQUEUE_FIELDS = ("%j", "%a", "%q", "%P", "%l", "%D", "%f", "%v", "%Z", "%o")
_SEP = "\x1f"
_UNSET = ("", "(null)", "N/A", "UNLIMITED", "NOT_SET", "INVALID")


def squeue_command(job_id: str) -> List[str]:
    return ["squeue", "-h", "-j", job_id, "-o", _SEP.join(SQUEUE_FIELDS)]


def sbatch_command(job_id: str, squeue_line: str, script_args: Sequence[str],
                   script: Optional[str] = None, exclude: Sequence[str] = ()) -> List[str]:
    """sbatch for the next job: behind this one (afterany: never two jobs of the chain at
    once), on this job's node count, with its time limit, account, QOS, partition, constraint,
    reservation, name and working directory; the batch script and its arguments again. Options
    given on the first sbatch line other than these (e.g. --output) are not carried: put them in
    the script's #SBATCH lines."""
    values = squeue_line.rstrip("\n").split(_SEP)
    if len(values) != len(SQUEUE_FIELDS):
        raise InputError(f"squeue gave {len(values)} fields for job {job_id}, expected "
                         f"{len(SQUEUE_FIELDS)}: {squeue_line!r}")
    name, account, qos, partition, limit, nodes, features, reservation, workdir, command = values
    cmd = ["sbatch", "--parsable", f"--dependency=afterany:{job_id}", f"--nodes={nodes}"]
    for option, value in (("--time", limit), ("--account", account), ("--qos", qos),
                          ("--partition", partition), ("--constraint", features),
                          ("--reservation", reservation), ("--job-name", name),
                          ("--chdir", workdir)):
        if value.strip() not in _UNSET:
            cmd.append(f"{option}={value}")
    if exclude:
        cmd.append(f"--exclude={','.join(exclude)}")
    return cmd + ["--", script or script_path(command, script_args), *script_args]


def script_path(command: str, script_args: Sequence[str]) -> str:
    """The batch script's path from Slurm's record of the command, which is the path and the
    arguments joined by single spaces (their quoting lost): the known arguments are cut off."""
    tail = "".join(" " + a for a in script_args)
    if command not in _UNSET and command.endswith(tail) and len(command) > len(tail):
        return command[:len(command) - len(tail)]
    raise InputError(f"cannot tell the batch script's path from Slurm's command {command!r} "
                     f"and the arguments {shlex.join(script_args)!r}; set {SCRIPT} to the "
                     "script to submit again")


def next_env(submitted: Mapping[str, str], attempt: int, failures: int = 0) -> Dict[str, str]:
    """The next job's environment: the one this job was submitted with (before env.sh changed
    it: NCCL_NET depends on the node count, MEGATRON_JOB_END_TIME on the job), without this job's
    SLURM_* variables
    (Slurm sets the next job's; SLURM_CONF names the cluster and stays), with the attempt."""
    env = {k: v for k, v in submitted.items()
           if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    env[ATTEMPT] = str(attempt + 1)
    env[FAILURES] = str(failures)
    return env


def read_env_file(path: str) -> Dict[str, str]:
    """`env -0` output (chain.sh writes it before env.sh is sourced)."""
    try:
        with open(path, "rb") as f:
            items = f.read().decode(errors="surrogateescape").split("\0")
    except OSError as e:
        raise InputError(f"cannot read the job's submission environment {path!r} "
                         f"({e.strerror}); chain.sh's megatron_chain_init writes it") from None
    return dict(item.split("=", 1) for item in items if "=" in item)


def submit_next(job_id: str, script_args: Sequence[str], submitted: Mapping[str, str],
                attempt: int, script: Optional[str] = None, failures: int = 0,
                exclude: Sequence[str] = ()) -> str:
    """Submits the next job; returns its id. Raises InputError with Slurm's message."""
    query = _run(squeue_command(job_id))
    if query.returncode != 0 or not query.stdout.strip():
        raise InputError(f"squeue found no record of job {job_id}: {query.stderr.strip()}")
    cmd = sbatch_command(job_id, query.stdout.splitlines()[0], script_args, script, exclude)
    log.info("submitting: %s", shlex.join(cmd))
    done = _run(cmd, env=next_env(submitted, attempt, failures))
    if done.returncode != 0:
        raise InputError(f"sbatch refused the next job (exit status {done.returncode}): "
                         f"{done.stderr.strip()}")
    return done.stdout.strip().split(";")[0]


def _run(cmd: List[str], env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env=env)
    except OSError as e:
        raise InputError(f"cannot run {cmd[0]} ({e.strerror}): chained jobs need Slurm's "
                         "commands on PATH inside the batch job") from None
