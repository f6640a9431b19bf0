"""One process launch that runs the jobs of several distributed test modules in turn, so they
share one python + torch + DeepSpeed start-up and one rendezvous per world size (start-up is
most of what a launch of these workers costs on 2 cores). Run under torchrun, or alone for one
rank; tests/support/launch_batches.py writes the job list and reads the results.

    torchrun --nproc_per_node 4 tests/support/shared_launch.py --jobs jobs.json

Each job names a worker module of tests/support (a file with `main() -> int` that parses
sys.argv, as run_layouts.py) and its arguments. The worker runs as it would alone: its module and
its sibling modules are imported anew for each job (no module state, such as a worker's --set
list, carries from one job to the next); only the libraries (torch, DeepSpeed, megatron) and the
world's process group stay: the groups a job made end with it, and a job that still holds some
(their gloo threads running on) fails. After a job's main returns 0 every rank waits for the
others, then rank 0 writes the job's `done` marker (its seconds); the first job that fails (an
exception or a non-zero status) ends the launch with its status at once (no goodbye barrier), so
the launcher knows which job failed and runs the rest anew; each rank's notes (rank_notes) keep
what it said of the failure.
"""
from __future__ import annotations

import argparse
import faulthandler
import importlib
import json
import os
import signal
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the workers import their siblings by bare name
from threads import gloo_threads  # noqa: E402


def _forget_workers() -> None:
    """Drops every module imported from tests/support by bare name (the workers and their
    siblings), so the next job imports them fresh, as a process of its own would."""
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if "." not in name and os.path.dirname(os.path.abspath(path)) == HERE:
            del sys.modules[name]


def rank_notes(jobs_path: str, rank: int) -> str:
    """Where rank `rank` of the launch of `jobs_path` writes what it says of a failure."""
    return f"{jobs_path}.rank{rank}.txt"


def _joined() -> bool:
    import torch.distributed as dist
    return dist.is_initialized()


def _barrier() -> None:
    import torch.distributed as dist
    if dist.is_initialized():
        dist.barrier()


def _leave_now(said: str, code: int, notes) -> None:
    """Ends this rank at once with `code`: not through leave_distributed, whose barrier would
    hold it for the process group's timeout (minutes) while its peers are still in the failed
    job; its exit ends their collectives, or the launcher ends them (their stacks go to their
    notes)."""
    print(said, file=sys.stderr, flush=True)
    print(said, file=notes, flush=True)
    sys.stdout.flush()
    os._exit(code)


def run_job(job: dict) -> int:
    """Runs one job's worker; the process groups it made end with it (worker_exit.groups_ended:
    a worker that leaves some would slow every later job of the launch)."""
    _forget_workers()
    from worker_exit import groups_ended
    worker = importlib.import_module(job["worker"])
    saved = sys.argv
    sys.argv = [worker.__file__, *job["argv"]]
    try:
        with groups_ended():
            return int(worker.main() or 0)
    finally:
        sys.argv = saved


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", required=True, help="JSON: [{worker, argv, done}, ...]")
    args = p.parse_args()
    with open(args.jobs) as f:
        jobs = json.load(f)
    rank = int(os.environ.get("RANK", "0"))
    # What each rank says of a failure goes to a file of its own as well (stderr interleaves the
    # ranks and the launcher keeps only its end): the traceback of a job that raised, and the
    # stack of a rank the launcher ends with SIGTERM (one stuck while its peers failed).
    notes = open(rank_notes(args.jobs, rank), "w")
    faulthandler.register(signal.SIGTERM, file=notes, all_threads=True, chain=True)
    kept = 0  # the gloo threads after the job before (the world's group's, once joined)
    for job in jobs:
        print(f"shared_launch: {job['name']}", file=sys.stderr, flush=True)
        began = time.monotonic()
        joined = _joined()
        try:
            code = run_job(job)
        except BaseException:
            traceback.print_exc()
            traceback.print_exc(file=notes)
            _leave_now(f"shared_launch: job {job['name']} failed", 1, notes)
        if code != 0:
            _leave_now(f"shared_launch: job {job['name']} exited {code}", code, notes)
        threads = gloo_threads()
        if joined and threads > kept:  # (a job that joins the world's group adds its threads)
            _leave_now(f"shared_launch: job {job['name']} left {threads - kept} gloo threads "
                       f"running (process groups it made still held after it ended: a model or "
                       f"engine kept, a job not closed); they would slow every later job", 1,
                       notes)
        kept = threads
        _barrier()
        if rank == 0:
            with open(job["done"], "w") as f:
                f.write(f"{time.monotonic() - began:.1f}\n")  # the job's seconds
    return 0


if __name__ == "__main__":
    from worker_exit import exit_after
    exit_after(main)
