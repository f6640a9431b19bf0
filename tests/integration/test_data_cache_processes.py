"""Index cache across processes: one builder among concurrent processes, and rank 0 building for
a torch.distributed job (errors reach every rank)."""
import multiprocessing
import time

import numpy as np
import pytest
import torch.distributed  # noqa: F401 -- imported once here, inherited by forked ranks

from megatron.config.errors import InputError
from megatron.data import index_cache
from tests.support.procs import free_port


def _build_marked(directory, marks, _):
    def build():
        with open(marks, "a") as f:
            f.write("built\n")
        time.sleep(0.3)
        return {"x": np.arange(5)}
    return index_cache.load_or_build(directory, "entry", ["x"], build)["x"].tolist()


def test_concurrent_processes_build_once(tmp_path):
    marks = str(tmp_path / "marks")
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(3) as pool:
        results = pool.starmap(_build_marked, [(str(tmp_path / "c"), marks, i) for i in range(3)])
    assert results == [[0, 1, 2, 3, 4]] * 3
    assert open(marks).read() == "built\n"


def _rank(rank, port, directory, fail, queue):
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
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
    port = free_port()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, str(tmp_path / "c"), fail, queue))
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
