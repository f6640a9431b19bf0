"""The run directory's owner: the one module that names its files, checks it is usable before
anything is written, holds its lock, and answers which checkpoint continues the run.

    <run.dir>/
      config.yaml      the resolved config (the file to resume with), replaced once a run starts
      deepspeed.json   the DeepSpeed config generated from it
      metrics.jsonl    one record per line (base/records.py)
      metrics.jsonl.damaged  what a crash left at its end, set aside on resume (training/metrics.py)
      tensorboard/     the same scalars as TensorBoard events
      checkpoints/     committed checkpoints and saves in progress (base/store.py)
      rolled_back/     <UTC time>-above-step_N/: the checkpoints a checkpoint.roll_back run
                       moved out of checkpoints/ (kept; delete them when sure)
      chain.log        the job chain's decisions, one line each (training/chain.py)
      hangs/           <job>/rank<N>.txt: every thread's stack when that rank's watchdog fired;
                       <job>/unresponsive.txt: the ranks that never reported
      bad_nodes        nodes found bad (health check, unresponsive, died first), for the chain
      .lock            held by rank 0 of the run that uses the directory

Standard library only (the planner and the job chain read run directories without torch).

The lock is an flock on <run.dir>/.lock held by rank 0 for the whole run. The kernel releases it
when the process dies, however it dies, so a lock left by a killed job is stale by construction:
the next run takes it over and says whose it was. The file names the holder (host, pid, Slurm
job, start time) for the refusal message. flock is honoured across nodes on Lustre mounted with
the flock option (Frontier's Orion is); on a file system without it two runs on different nodes
are not kept apart."""
from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Optional, Tuple

from megatron.base import store
from megatron.base.outputs import check_output
from megatron.config.errors import InputError, unexpanded

log = logging.getLogger(__name__)

CONFIG, DEEPSPEED, METRICS, TENSORBOARD, CHECKPOINTS, LOCK, CHAIN_LOG, HANGS, BAD_NODES, WANDB = (
    "config.yaml", "deepspeed.json", "metrics.jsonl", "tensorboard", "checkpoints", ".lock",
    "chain.log", "hangs", "bad_nodes", "wandb")
METRICS_DAMAGED = METRICS + ".damaged"
ROLLED_BACK = "rolled_back"


@dataclass(frozen=True)
class Continuation:
    """The one answer to "which checkpoint continues this run": the newest folder that
    validates, the newer ones skipped with their reasons, the newest complete one before it
    (named if a file of the chosen one turns out damaged), and saves that never committed."""
    ckpt_dir: str
    found: Optional[store.Found]
    skipped: Tuple[str, ...] = ()
    last_good: Optional[str] = None
    leftovers: Tuple[str, ...] = ()

    @property
    def step(self) -> int:
        return self.found.step if self.found else 0

    def warn(self) -> None:
        """Logs each skipped folder and each leftover staging folder once."""
        for line in self.skipped:
            log.warning("skipping checkpoint %s", line)
        for folder in self.leftovers:
            log.warning("ignoring %s: a save that never committed (a killed job); delete it "
                        "when no job is writing to %s", folder, self.ckpt_dir)

    def only_broken(self) -> str:
        """Why nothing continues although checkpoints exist ('' when none exist at all)."""
        return "; ".join(self.skipped)


def continuation(ckpt_dir: str) -> Continuation:
    """Continuation of a checkpoints folder (any folder laid out as store.py writes)."""
    found, skipped = store.newest_complete(ckpt_dir)
    last_good = None
    if found is not None:
        older = [f for s, f in store.committed(ckpt_dir) if s < found.step]
        last_good = next((f for f in older if store.is_valid(f)), None)
    return Continuation(ckpt_dir, found, tuple(skipped), last_good,
                        tuple(store.leftovers(ckpt_dir)))


class RunDir:
    """A run directory by path; nothing is created until check() or a write."""

    def __init__(self, path: str):
        self.path = path

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    @property
    def config(self) -> str:
        return self.file(CONFIG)

    @property
    def deepspeed_json(self) -> str:
        return self.file(DEEPSPEED)

    @property
    def metrics(self) -> str:
        return self.file(METRICS)

    @property
    def metrics_damaged(self) -> str:
        """Where resume moves the damaged tail of metrics.jsonl (a line a kill cut short, blocks a
        node's crash left zero-filled), appended, so the bytes stay for a person to look at."""
        return self.file(METRICS_DAMAGED)

    @property
    def tensorboard(self) -> str:
        return self.file(TENSORBOARD)

    @property
    def wandb(self) -> str:
        """W&B's folder with run.wandb=offline or online (wandb.init(dir=) adds its own
        "wandb" below the directory it is given: pass RunDir.path)."""
        return self.file(WANDB)

    @property
    def checkpoints(self) -> str:
        return self.file(CHECKPOINTS)

    @property
    def rolled_back(self) -> str:
        """Where checkpoint.roll_back moves the checkpoints above the step a run starts from
        (store.set_aside_above), one folder per rollback."""
        return self.file(ROLLED_BACK)

    @property
    def hangs(self) -> str:
        """Where a rank's hang watchdog writes its threads' stacks (training/watchdog.py)."""
        return self.file(HANGS)

    def hang_stacks(self, job: str, rank: int) -> str:
        """One rank's stacks when its watchdog fired in job `job` (a folder per job of the run,
        so a chain keeps every job's hangs)."""
        return os.path.join(self.hangs, job, f"rank{rank:05d}.txt")

    def hang_summary(self, job: str) -> str:
        """Written once per hung job, by the first rank to claim it: which ranks never reported."""
        return os.path.join(self.hangs, job, "unresponsive.txt")

    @property
    def bad_nodes(self) -> str:
        """Nodes found bad, one "node<TAB>why" line each: a failed health check
        (launch/health.py), ranks that stopped answering (training/watchdog.py) or computed a
        step differently (training/sdc.py), a task that died first (training/chain_nodes.py);
        the job chain leaves them out of the next job."""
        return self.file(BAD_NODES)

    def add_bad_node(self, node: str, why: str) -> None:
        """Appends one line with a single write (several ranks of a node may fail at once)."""
        os.makedirs(self.path, exist_ok=True)
        fd = os.open(self.bad_nodes, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{node}\t{why}\n".encode())
        finally:
            os.close(fd)

    def read_bad_nodes(self) -> list:
        """The nodes named in bad_nodes, each once, in the order they first failed."""
        try:
            with open(self.bad_nodes) as f:
                names = [line.split("\t", 1)[0].strip() for line in f if line.strip()]
        except FileNotFoundError:
            return []
        return list(dict.fromkeys(n for n in names if n))

    @property
    def chain_log(self) -> str:
        """One line per decision of the job chain (training/chain.py)."""
        return self.file(CHAIN_LOG)

    def check(self) -> None:
        check_run_dir(self.path)

    def lock(self) -> "RunLock":
        return RunLock(self.path)

    def require(self) -> None:
        """One message when this is not a run directory megatron-train wrote."""
        what = "it holds config.yaml and checkpoints/"
        if not os.path.isdir(self.path):
            why = "is a file" if os.path.exists(self.path) else \
                f"does not exist{unexpanded(self.path)}"
            raise InputError(f"run directory {self.path!r} {why}; pass a directory written by "
                             f"megatron-train ({what})")
        if not os.path.isfile(self.config):
            raise InputError(f"{self.config!r} is missing: {self.path!r} is not a run directory "
                             f"written by megatron-train ({what})")

    def write_run_files(self, config_yaml: str, deepspeed_json: str) -> None:
        """config.yaml and deepspeed.json, each written whole and then renamed into place."""
        for path, text in ((self.config, config_yaml), (self.deepspeed_json, deepspeed_json)):
            try:
                with open(path + ".tmp", "w") as f:
                    f.write(text)
                os.replace(path + ".tmp", path)
            except OSError as e:
                store.remove_quietly(path + ".tmp")
                full = store.disk_full(path, "the run's " + os.path.basename(path), e,
                                       len(text.encode()))
                if full is None:
                    raise
                raise full from None

    def continuation(self) -> Continuation:
        return continuation(self.checkpoints)

    def checkpoint(self, tag: Optional[str] = None) -> str:
        """The folder of checkpoint `tag`, or of the newest complete one; InputError when there
        is none."""
        return checkpoint_in(self.checkpoints, tag)


def checkpoint_in(ckpt_dir: str, tag: Optional[str] = None) -> str:
    """checkpoint() of any checkpoints folder."""
    if tag is None:
        c = continuation(ckpt_dir)
        for line in c.skipped:
            log.warning("skipping checkpoint %s", line)
        if c.found is None:
            raise InputError(f"no complete checkpoint in {ckpt_dir!r}"
                             + (f" ({c.only_broken()})" if c.skipped else "")
                             + "; train with checkpoint.save=true or point --run-dir at a "
                             "run that saved one")
        return c.found.folder
    folder = os.path.join(ckpt_dir, tag)
    if not os.path.isdir(folder):
        tags = sorted(os.path.basename(f) for _, f in store.committed(ckpt_dir))
        raise InputError(f"checkpoint folder {folder!r} does not exist; tags found in "
                         f"{ckpt_dir!r}: {', '.join(tags) or 'none'}")
    return folder


def check_run_dir(path: str) -> None:
    """Creates run.dir if needed; one message when it cannot hold a run."""
    check_output("run.dir", path, "dir")
    where = f"run.dir={path!r}"
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise InputError(f"{where} cannot be created ({e.strerror}); choose a writable "
                         "location (on Frontier, $MEMBERWORK or $PROJWORK scratch)") from None
    probe = os.path.join(path, f".write-test-{os.getpid()}")
    try:
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        store.remove_quietly(probe)
        full = store.disk_full(path, f"a probe file ({where})", e)
        if full is not None:
            raise full from None
        raise InputError(f"{where} is not writable ({e.strerror}); choose a writable location "
                         "or fix its permissions") from None


class RunLock:
    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, LOCK)
        self.fd: Optional[int] = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise InputError(
                f"run.dir {os.path.dirname(self.path)!r} is in use by another run "
                f"({_describe(holder)}); two runs on one directory would mix their metrics and "
                "checkpoints. Wait for it to end or stop it, or choose another run.dir") from None
        previous = _read(fd)
        if previous:
            log.info("run.dir lock taken over from a run that has ended (%s)",
                     _describe(previous))
        me = {"host": socket.gethostname(), "pid": os.getpid(),
              "slurm_job": os.environ.get("SLURM_JOB_ID"), "started": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        os.fsync(fd)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def _read(fd: int) -> dict:
    try:
        data = os.pread(fd, 4096, 0)
        return json.loads(data) if data.strip() else {}
    except (OSError, ValueError):
        return {}


def _describe(holder: dict) -> str:
    if not holder:
        return "holder unknown"
    job = f", Slurm job {holder['slurm_job']}" if holder.get("slurm_job") else ""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return f"host {holder.get('host')}, pid {holder.get('pid')}{job}, since {since}"
