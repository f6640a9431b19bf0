"""Index cache across processes: one builder among concurrent processes, and rank 0 building for
a torch.distributed job (errors reach every rank)."""
import multiprocessing
import time

import numpy as np
import pytest
import torch.distributed

from megatron.config.errors import InputError
from megatron.data import index_cache


def _build_marked(directory, marks, start, results):
    def build():
        with open(marks, "a") as f:
            f.write("built\n")
        time.sleep(0.3)
        return {"x": np.arange(5)}
    start.wait(timeout=120)  # every process has imported what it needs: they race from here
    results.put(index_cache.load_or_build(directory, "entry", ["x"], build)["x"].tolist())


# Spawned, not forked: by the time these run, earlier tests have left threads in this process
# (torch's pools, gloo's), and a fork copies whatever lock one of them held into a child that
# then waits on it forever.
CONTEXT = multiprocessing.get_context("spawn")


def test_concurrent_processes_build_once(tmp_path):
    marks = str(tmp_path / "marks")
    start, results = CONTEXT.Barrier(3), CONTEXT.Queue()
    procs = [CONTEXT.Process(target=_build_marked,
                             args=(str(tmp_path / "c"), marks, start, results))
             for _ in range(3)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert got == [[0, 1, 2, 3, 4]] * 3
    assert open(marks).read() == "built\n"


def _rank(rank, store, directory, fail, queue):
    dist = torch.distributed
    # a file store: no port to pick in advance and lose to another process before it is bound
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=2)
    try:
        def build():
            if fail:
                raise OSError("disk full")
            time.sleep(0.2)  # rank 1 must wait for this, not race it
            return {"x": np.arange(3) + rank}
        try:
            got = index_cache.load_or_build(directory, "e", ["x"], build)["x"].tolist()
            queue.put((rank, got))
        except InputError as e:
            queue.put((rank, str(e)))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("fail", [False, True])
def test_distributed_rank0_builds_and_errors_reach_every_rank(tmp_path, fail):
    store = str(tmp_path / "store")
    queue = CONTEXT.Queue()
    procs = [CONTEXT.Process(target=_rank, args=(r, store, str(tmp_path / "c"), fail, queue))
             for r in (0, 1)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    if fail:
        assert all("building the data index" in results[r] and "disk full" in results[r]
                   for r in (0, 1))
    else:
        assert results == {0: [0, 1, 2], 1: [0, 1, 2]}  # both read rank 0's arrays
