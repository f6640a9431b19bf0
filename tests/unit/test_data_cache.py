"""Index cache: reuse, names that change with every input, atomic entries. One builder among
concurrent processes and rank 0 building for a torch.distributed job:
tests/integration/test_data_cache_processes.py."""
import os

import numpy as np
import pytest

from tests.support.data import write_tokens
from megatron.data import gpt_dataset
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
