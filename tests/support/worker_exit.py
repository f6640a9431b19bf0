"""How the torchrun workers of the tests end: leave the process group, then exit; and how
a worker's own process groups end with the work that made them (groups_ended)."""
from __future__ import annotations

import contextlib
import gc
import sys
from typing import Callable, NoReturn

from megatron.launch.device import leave_distributed


def exit_after(main: Callable[[], int]) -> NoReturn:
    """Run a worker's main and exit with its status, after leaving the process group as
    megatron-train does: left to exit-time destructors, a gloo rank can abort after a run that
    succeeded ("terminate called without an active exception"); CI saw it in these workers."""
    code = main()
    leave_distributed()
    sys.exit(code)


@contextlib.contextmanager
def groups_ended():
    """Ends the process groups made inside the block (its caller's ParallelState.build, a
    startup.start not closed), as the trainer's Job.close does for a run: each gloo group's
    threads wake on their own while it lives, idle or not (100 idle groups took 11% of a core
    per rank here), and a launch whose jobs left theirs held ~270 per rank, which doubled the
    later jobs' step times on 2 cores. Collected after the block, when its locals are gone."""
    from megatron.parallel.state import destroy_groups_since, live_groups
    before = live_groups()
    try:
        yield
    finally:
        destroy_groups_since(before)
        # a job started inside froze what existed before it (training/startup.py), an earlier
        # job's objects among them, which a collection would then never free
        gc.unfreeze()
        gc.collect()
