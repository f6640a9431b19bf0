"""Asynchronous saves write what synchronous ones write, and fail as loudly: a checkpoint written
by a writer thread from reused host buffers is byte for byte the synchronous one of the same
state (shards and index.json), even when the state changes once the snapshot is copied; an
error in the writer is the save's outcome (one message naming the rank and the cause, the
staging folder removed, the previous checkpoint intact), never an exception in a thread nobody
sees. The memory bound and the save record of older lines are here too."""
import errno
import json
import os

import pytest
import torch

from megatron.base import store
from megatron.checkpoint import sharded, snapshot
from megatron.base.records import SaveEvent, parse_metrics_line
from megatron.config.errors import InputError
from tests.support.async_saves import (SIZES, background, check_background_saves, files_of,
                                       flat_state, meta)

def test_a_background_save_is_byte_identical_to_a_synchronous_one(tmp_path, one_rank_group):
    rs, flats = flat_state()
    assert check_background_saves(tmp_path, rs, flats)["bytes"] > 12 * sum(SIZES)
    # the second save, through the reused buffers, holds the changed state
    loaded = torch.load(str(tmp_path / "async/step_0000006" / sharded.shard_file(rs.coords)),
                        weights_only=True)
    assert torch.equal(loaded["pieces"]["p2"]["master"], rs.params[2].fragments[0].master)


def test_a_writer_that_fails_is_one_message_naming_the_rank_and_the_cause(
        tmp_path, one_rank_group, monkeypatch):
    rs, _ = flat_state()
    ckpt = str(tmp_path / "ckpt")
    sharded.save(ckpt, 2, rs, meta(2))
    monkeypatch.setenv(sharded.FAIL_WRITER_VAR, "0:4")
    pending = background(ckpt, 4, rs, snapshot.Buffers())
    pending.join()
    assert pending.failed() and not pending.busy()
    with pytest.raises(InputError) as e:
        pending.finish()
    msg = str(e.value)
    assert msg.startswith(f"checkpoint {ckpt}/step_0000004 was not committed: rank 0: "), msg
    assert "an error injected into the writer" in msg and "\n" not in msg, msg
    assert "staging-step_0000004 was removed" in msg, msg
    assert sorted(os.listdir(ckpt)) == ["latest", "step_0000002"]
    assert store.validate(os.path.join(ckpt, "step_0000002")).step == 2


def test_a_full_disk_in_the_writer_thread_names_the_path_and_the_bytes(
        tmp_path, one_rank_group, monkeypatch):
    """os.write fails with ENOSPC after 1 MB, as write(2) does on a full disk; the real full
    disk (a tmpfs) is tests/integration/test_training_async_save.py."""
    room = [1 << 20]

    def full(fd, data):
        if len(data) > room[0]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        room[0] -= len(data)
        return os.write(fd, data)
    rs, _ = flat_state()
    monkeypatch.setattr(snapshot, "_write", full)
    ckpt = str(tmp_path / "ckpt")
    pending = background(ckpt, 4, rs, snapshot.Buffers())
    pending.join()
    with pytest.raises(InputError) as e:
        pending.finish()
    msg = str(e.value)
    assert "rank 0: " in msg and "no space left on device" in msg and "\n" not in msg, msg
    assert "shards/tp00_pp000_dp00000.pt" in msg, msg
    assert f"needs at least {12 * sum(SIZES):,} bytes" in msg, msg
    assert os.listdir(ckpt) == []


@pytest.mark.parametrize("available_kb, ranks, short", [(4 << 20, 1, False), (4 << 20, 8, True),
                                                         (1 << 10, 1, True)])
def test_the_memory_bound_counts_the_snapshot_the_writer_and_the_ranks_on_the_node(
        tmp_path, available_kb, ranks, short):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal:       99999999 kB\nMemAvailable:   {available_kb} kB\n")
    needed = 12 * 100_000_000  # 100M elements owned: 1.2 GB
    missing, share = snapshot.memory_shortfall(needed, ranks, str(meminfo))
    assert share == available_kb * 1024 // ranks
    assert (missing > 0) == short
    if short:
        assert missing == needed + snapshot.WRITER_BYTES - share


def test_the_memory_bound_refuses_nothing_where_memory_cannot_be_read(tmp_path):
    assert snapshot.memory_shortfall(10 ** 15, 1, str(tmp_path / "absent")) == (0, None)


def test_save_lines_written_before_blocking_s_still_read():
    old = {"event": "save", "step": 3, "seconds": 1.5, "gb": 0.1, "gb_per_s": 0.07}
    assert parse_metrics_line(old) == SaveEvent(3, 1.5, 0.1, 0.07)
    new = json.loads(json.dumps({**old, "blocking_s": 0.01, "background_s": 1.2}))
    assert parse_metrics_line(new).blocking_s == 0.01


def test_the_local_tier_drains_the_same_bytes_and_keeps_nothing_drained(tmp_path, one_rank_group):
    rs, _ = flat_state()
    sharded.save(str(tmp_path / "sync"), 5, rs, meta(5))
    local = str(tmp_path / "nvme")
    pending = sharded.PendingSave(str(tmp_path / "tiered"), 5, rs, meta(5), 0, None, local)
    pending.write_local()  # what the loop waits for in a synchronous save to the local tier
    assert os.path.getsize(pending.local) > 12 * sum(SIZES)
    pending.start_writer()  # the drain
    pending.join()
    pending.finish()
    assert files_of(str(tmp_path / "sync/step_0000005")) == \
        files_of(str(tmp_path / "tiered/step_0000005"))
    assert not os.path.exists(pending.local), "a drained local file was kept"


def test_a_local_tier_that_cannot_be_written_is_one_message_naming_the_setting(
        tmp_path, one_rank_group):
    rs, _ = flat_state()
    blocker = tmp_path / "nvme"
    blocker.write_text("a file where the folder should be")
    ckpt = str(tmp_path / "ckpt")
    pending = sharded.PendingSave(ckpt, 5, rs, meta(5), 0, None, str(blocker))
    pending.write_local()
    pending.start_writer()
    pending.join()
    with pytest.raises(InputError) as e:
        pending.finish()
    msg = str(e.value)
    assert f"rank 0: checkpoint.save_local_dir='{blocker}' cannot take its checkpoint file" in msg
    assert "\n" not in msg and os.listdir(ckpt) == [], msg
