"""What a save costs beyond its bytes (issue 40 item 2): the fsyncs, renames and files one save
makes on rank 0 in series, counted in a real save, are the ones base/store.py declares and the
estimate of an unmeasured save prices; and the start-up probe measures the latency of one fsync
(a slowed file system, MEGATRON_TEST_SLOW_FILES, is seen by it) apart from the write speed.
The stop save of a job on slowed storage: tests/integration/test_training_deadline_save.py."""
import collections
import os

import pytest

import torch

from megatron.base import faults, store
from megatron.base.records import CheckpointMeta
from megatron.checkpoint import sharded
from megatron.checkpoint.state import Fragment, LocalParam, Partition, RankState
from megatron.parallel.state import RankCoord
from megatron.training.checkpointer import probe_storage
from tests.support.checkpoints import meta_json


def rank_state(numel=4096) -> RankState:
    frag = Fragment(0, numel, torch.randn(numel), {"exp_avg": torch.zeros(numel),
                                                   "exp_avg_sq": torch.zeros(numel)})
    return RankState([LocalParam("w", (numel,), Partition(), fragments=[frag])], True,
                     RankCoord(0, 0, 0), {"cpu": torch.get_rng_state()})


def meta(step):
    return CheckpointMeta.from_json(meta_json(step, {}))


def test_a_save_makes_the_fsyncs_renames_and_files_the_store_declares(
        tmp_path, one_rank_group, monkeypatch):
    ckpt = str(tmp_path / "checkpoints")
    sharded.save(ckpt, 2, rank_state(), meta(2))  # the folder exists, as after a first save
    counts = collections.Counter()

    def counting(name, real):
        def call(*a, **k):
            counts[name] += 1
            return real(*a, **k)
        return call
    for name in ("fsync", "rename", "replace"):
        monkeypatch.setattr(os, name, counting(name, getattr(os, name)))
    real_open = os.open

    def os_open(path, flags, *a):
        if flags & os.O_CREAT:
            counts["created"] += 1
        return real_open(path, flags, *a)
    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(store, "open", lambda p, m="r", *a, **k: (
        counts.update(["created"] if "w" in m else []), open(p, m, *a, **k))[1], raising=False)
    sharded.save(ckpt, 4, rank_state(), meta(4))
    assert counts["fsync"] == store.SAVE_FSYNCS, counts
    assert counts["rename"] + counts["replace"] == store.SAVE_RENAMES, counts
    assert counts["created"] == store.SAVE_FILES, counts


def test_the_probe_measures_an_fsync_apart_from_the_bytes(tmp_path, monkeypatch):
    folder = tmp_path / "checkpoints"
    speed, fsync_s = probe_storage(str(folder))
    assert speed > 1e6 and fsync_s < 0.5
    assert not folder.exists()  # the probe made it, the probe removed it
    monkeypatch.setenv(faults.SLOW_FILES_VAR, "0.2")
    # the disk's own fsyncs left out: under a loaded CI machine they added 0.18 s to the 0.2
    monkeypatch.setattr(store.os, "fsync", lambda fd: None)
    slow_speed, slow_fsync = probe_storage(str(folder))
    assert slow_fsync == pytest.approx(0.2, abs=0.05), slow_fsync
    assert slow_speed > 1e6  # the latency is not taken for a slow transfer
    monkeypatch.undo()
    folder.mkdir()
    probe_storage(str(folder))
    assert folder.is_dir() and os.listdir(folder) == []  # a folder it found stays, empty
