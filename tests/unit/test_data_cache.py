"""Index cache: reuse, names that change with every input, atomic entries, one builder among
concurrent processes, and rank 0 building for a torch.distributed job (errors reach every rank)."""
import multiprocessing
import os
import time

import numpy as np
import pytest
import torch.distributed  # noqa: F401 -- imported once here, inherited by forked ranks

from tests.support.data import write_tokens
from megatron.config.errors import InputError
from megatron.data import gpt_dataset, index_cache
from megatron.data.gpt_dataset import GPTDataset
from megatron.data.indexed_dataset import IndexedDataset


def _dataset(prefix, cache, **kw):
    args = dict(documents=(0, 10), num_samples=50, seq_length=8, seed=1)
    args.update(kw)
    return GPTDataset(IndexedDataset(prefix), "train", args["documents"], args["num_samples"],
                      args["seq_length"], args["seed"], cache)


def test_second_build_loads_the_cached_index(tmp_path, monkeypatch):
    prefix, cache = str(tmp_path / "d"), str(tmp_path / "cache")
    write_tokens(prefix, [[i] * (i + 3) for i in range(10)])
    first = _dataset(prefix, cache)
    monkeypatch.setattr(gpt_dataset, "build_gpt_index", lambda *a: pytest.fail("rebuilt"))
    second = _dataset(prefix, cache)
    assert np.array_equal(first.shuffle_idx, second.shuffle_idx)
    assert isinstance(second.sample_idx, np.memmap)  # loaded, memory-mapped
    assert not [n for n in os.listdir(cache) if ".tmp-" in n or n.endswith(".lock")]


def test_every_input_selects_its_own_entry(tmp_path):
    prefix, cache = str(tmp_path / "d"), str(tmp_path / "cache")
    write_tokens(prefix, [[i] * (i + 3) for i in range(10)])
    _dataset(prefix, cache)
    for change in ({"seed": 2}, {"num_samples": 60}, {"seq_length": 9}, {"documents": (0, 9)}):
        _dataset(prefix, cache, **change)
    assert len(os.listdir(cache)) == 5
    write_tokens(prefix, [[i] * (i + 4) for i in range(10)])  # same name, other data
    _dataset(prefix, cache)
    assert len(os.listdir(cache)) == 6


def test_default_cache_dir_is_next_to_the_data(tmp_path):
    prefix = str(tmp_path / "d")
    write_tokens(prefix, [[1, 2, 3, 4]] * 5)
    GPTDataset(IndexedDataset(prefix), "train", (0, 5), 3, 4, 0, os.path.dirname(prefix))
    assert any(n.startswith("d_train_3ns_4sl_0s_") for n in os.listdir(tmp_path))


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
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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
