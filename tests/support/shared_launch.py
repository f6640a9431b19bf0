"""One process launch that runs the jobs of several distributed test modules in turn, so they
share one python + torch + DeepSpeed start-up and one rendezvous per world size (start-up is
most of what a launch of these workers costs on 2 cores). Run under torchrun, or alone for one
rank; tests/support/launch_batches.py writes the job list and reads the results.

    torchrun --nproc_per_node 4 tests/support/shared_launch.py --jobs jobs.json

Each job names a worker module of tests/support (a file with `main() -> int` that parses
sys.argv, as run_layouts.py) and its arguments. The worker runs as it would alone: its module and
its sibling modules are imported anew for each job (no module state, such as a worker's --set
list, carries from one job to the next); only the libraries (torch, DeepSpeed, megatron) and the
process group stay. After a job's main returns 0 every rank waits for the others, then rank 0
writes the job's `done` marker; the first job that fails (an exception or a non-zero status) ends
the launch with its status, so the launcher knows which job failed and runs the rest anew.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the workers import their siblings by bare name


def _forget_workers() -> None:
    """Drops every module imported from tests/support by bare name (the workers and their
    siblings), so the next job imports them fresh, as a process of its own would."""
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if "." not in name and os.path.dirname(os.path.abspath(path)) == HERE:
            del sys.modules[name]


def _barrier() -> None:
    import torch.distributed as dist
    if dist.is_initialized():
        dist.barrier()


def run_job(job: dict) -> int:
    _forget_workers()
    worker = importlib.import_module(job["worker"])
    saved = sys.argv
    sys.argv = [worker.__file__, *job["argv"]]
    try:
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
    for job in jobs:
        print(f"shared_launch: {job['name']}", file=sys.stderr, flush=True)
        try:
            code = run_job(job)
        except BaseException:
            traceback.print_exc()
            print(f"shared_launch: job {job['name']} failed", file=sys.stderr, flush=True)
            return 1
        if code != 0:
            print(f"shared_launch: job {job['name']} exited {code}", file=sys.stderr, flush=True)
            return code
        _barrier()
        if rank == 0:
            with open(job["done"], "w") as f:
                f.write("ok\n")
    return 0


if __name__ == "__main__":
    from worker_exit import exit_after
    exit_after(main)
