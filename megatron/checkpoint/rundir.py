"""The run directory: usable before anything is written, and owned by one run at a time.

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
from typing import Optional

from megatron.config.errors import InputError

log = logging.getLogger(__name__)

LOCK = ".lock"


def check_run_dir(path: str) -> None:
    """Creates run.dir if needed; one message when it cannot hold a run."""
    where = f"run.dir={path!r}"
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.exists(path) and not os.path.isdir(path):
        raise InputError(f"{where} is a file, not a directory; choose another run.dir")
    try:
        os.makedirs(path, exist_ok=True)
    except NotADirectoryError:
        raise InputError(f"{where} cannot be created: a part of {parent!r} is a file, not a "
                         "directory; choose another run.dir") from None
    except OSError as e:
        raise InputError(f"{where} cannot be created ({e.strerror}); choose a writable "
                         "location (on Frontier, $MEMBERWORK or $PROJWORK scratch)") from None
    probe = os.path.join(path, f".write-test-{os.getpid()}")
    try:
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
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
