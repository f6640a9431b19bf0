"""A full disk (ENOSPC, simulated by a file whose writes fail) while the checkpoint package writes:
one InputError naming the path, 'no space left on device' and the bytes needed, and nothing
half-written left (no staging folder, no .tmp). And a prune a kill cut short (a .deleting-
folder) is finished by the next prune or save. The real full disk (a tiny tmpfs) is
tests/integration/test_checkpoint_full_disk_processes.py."""
import collections
import errno
import io
import logging
import os

import pytest
import torch

from megatron.base import store
from megatron.checkpoint import sharded, snapshot
from megatron.base.records import CheckpointMeta
from megatron.base.rundir import RunDir, check_run_dir
from megatron.checkpoint.state import Fragment, LocalParam, Partition, RankState
from megatron.config.errors import InputError
from megatron.parallel.state import RankCoord
from tests.support.checkpoints import meta_json

FULL = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class FullFile(io.FileIO):
    """A file on a disk with `room` bytes left: the write that crosses it writes what fits and
    raises ENOSPC, as write(2) does."""
    room = 100

    def write(self, b):
        b = bytes(b)
        left = self.room - self.tell()
        if len(b) > left:
            super().write(b[:max(left, 0)])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(b)


def full_open(path, mode="r", *args, **kwargs):
    if "w" in mode or "a" in mode:
        raw = FullFile(path, "w" if "w" in mode else "a")
        return raw if "b" in mode else io.TextIOWrapper(io.BufferedWriter(raw))
    return open(path, mode, *args, **kwargs)


def full_write(room=100):
    """os.write on a disk with `room` bytes left: the write that crosses it writes what fits and
    raises ENOSPC, as write(2) does (the shard's stream, checkpoint/snapshot.py)."""
    left = [room]

    def write(fd, data):
        n = min(len(data), left[0])
        if n < len(data):
            os.write(fd, bytes(data[:n]))
            left[0] -= n
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        left[0] -= n
        return os.write(fd, data)
    return write


def rank_state(numel=4096) -> RankState:
    master = torch.randn(numel)
    frag = Fragment(0, numel, master, {"exp_avg": torch.zeros(numel),
                                       "exp_avg_sq": torch.zeros(numel)})
    return RankState([LocalParam("w", (numel,), Partition(), fragments=[frag])], True,
                     RankCoord(0, 0, 0), {"cpu": torch.get_rng_state()})


def meta(step):
    return CheckpointMeta.from_json(meta_json(step, {}))


def leftovers(folder):
    return [os.path.join(d, n) for d, dirs, files in os.walk(folder) for n in dirs + files
            if n.startswith(".staging-") or n.endswith(".tmp") or ".tmp-" in n]


def test_a_full_disk_while_a_rank_writes_its_shard_is_one_message_and_no_staging_folder(
        tmp_path, one_rank_group, monkeypatch):
    """torch.save into the file raises RuntimeError ('unexpected pos ...'); the message names the
    disk, the shard's path and the bytes its tensors need, and rank 0 removes the staging."""
    ckpt = str(tmp_path / "checkpoints")
    sharded.save(ckpt, 2, rank_state(), meta(2))  # a good save before the disk fills
    monkeypatch.setattr(snapshot, "_write", full_write())
    with pytest.raises(InputError) as e:
        sharded.save(ckpt, 4, rank_state(), meta(4))
    msg = str(e.value)
    assert "\n" not in msg and "enforce fail" not in msg, msg
    assert "no space left on device" in msg and "shards/tp00_pp000_dp00000.pt" in msg, msg
    assert f"needs at least {3 * 4096 * 4:,} bytes" in msg and "bytes free" in msg, msg
    assert "staging-step_0000004 was removed" in msg, msg
    assert leftovers(ckpt) == []
    assert sorted(os.listdir(ckpt)) == ["latest", "step_0000002"]
    assert store.validate(os.path.join(ckpt, "step_0000002")).step == 2


@pytest.mark.parametrize("which", [store.INDEX, store.META])
def test_a_full_disk_while_rank_0_writes_index_or_meta_removes_the_staging_folder(
        tmp_path, one_rank_group, monkeypatch, which):
    ckpt = str(tmp_path / "checkpoints")

    def open_failing_on(path, mode="r", *a, **k):
        if os.path.basename(path) == which + ".tmp":
            return full_open(path, mode)
        return open(path, mode, *a, **k)
    monkeypatch.setattr(FullFile, "room", 10)
    monkeypatch.setattr(store, "open", open_failing_on, raising=False)
    with pytest.raises(InputError) as e:
        sharded.save(ckpt, 4, rank_state(), meta(4))
    msg = str(e.value)
    assert "no space left on device" in msg and which in msg and "needs " in msg, msg
    assert "was removed" in msg and "\n" not in msg, msg
    assert os.listdir(ckpt) == []


def test_write_durable_on_a_full_disk_names_the_file_and_leaves_no_tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "open", full_open, raising=False)
    path = str(tmp_path / "latest")
    with pytest.raises(InputError, match=r"latest: no space left on device while writing the "
                                         r"pointer \(needs 1,000 bytes, [\d,]+ bytes free\)"):
        store.write_durable(path, b"x" * 1000, "the pointer")
    assert os.listdir(tmp_path) == []


def test_another_os_error_is_not_called_a_full_disk(tmp_path):
    with pytest.raises(FileNotFoundError):
        store.write_durable(str(tmp_path / "no" / "such" / "dir" / "f"), b"x")
    assert store.disk_full("p", "x", PermissionError(errno.EACCES, "denied")) is None
    assert store.disk_full("p", "x", RuntimeError("unexpected pos 704 vs 598")) is None
    wrapped = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    wrapped.__context__ = OSError(errno.EDQUOT, "quota")
    assert "disk quota exceeded" in str(store.disk_full("p", "x", wrapped))


def test_run_files_on_a_full_disk_are_one_message_and_no_tmp(tmp_path, monkeypatch):
    import megatron.base.rundir as rundir
    monkeypatch.setattr(FullFile, "room", 10)
    monkeypatch.setattr(rundir, "open", full_open, raising=False)
    run = RunDir(str(tmp_path))
    with pytest.raises(InputError) as e:
        run.write_run_files("model: {num_layers: 4}\n" * 4, "{}")
    msg = str(e.value)
    assert msg.startswith(run.config) and "no space left on device" in msg, msg
    assert "config.yaml" in msg and "needs 92 bytes" in msg, msg
    assert os.listdir(tmp_path) == []


def test_check_run_dir_on_a_full_disk_says_so_and_leaves_no_probe(tmp_path, monkeypatch):
    import megatron.base.rundir as rundir
    monkeypatch.setattr(FullFile, "room", 0)
    monkeypatch.setattr(rundir, "open", full_open, raising=False)
    with pytest.raises(InputError, match="no space left on device while writing a probe file"):
        check_run_dir(str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_a_deletion_cut_short_is_finished_by_the_next_prune_and_named(tmp_path, caplog):
    ckpt = tmp_path / "checkpoints"
    doomed = ckpt / ".deleting-step_0000002"
    (doomed / "shards").mkdir(parents=True)
    (doomed / "shards" / "a.pt").write_bytes(b"weights")
    with caplog.at_level(logging.WARNING, logger="megatron.base.store"):
        assert store.prune(str(ckpt), keep_last=0) == []  # keep_last=0 keeps every checkpoint
    assert not doomed.exists()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and str(doomed) in lines[0] and "cut short" in lines[0], lines


def test_the_next_save_finishes_a_deletion_cut_short(tmp_path, one_rank_group, caplog):
    ckpt = tmp_path / "checkpoints"
    doomed = ckpt / ".deleting-step_0000002"
    doomed.mkdir(parents=True)
    (doomed / "meta.json").write_text("{}")
    with caplog.at_level(logging.WARNING, logger="megatron.base.store"):
        sharded.save(str(ckpt), 4, rank_state(), meta(4), keep_last=1)
    assert sorted(os.listdir(ckpt)) == ["latest", "step_0000004"]
    assert sum(str(doomed) in r.getMessage() for r in caplog.records) == 1


def _fail_after_rename(monkeypatch, where):
    """A full disk at one point after the rename that commits a checkpoint: the directory's
    flush, the `latest` pointer, or the prune of older checkpoints (keep_last)."""
    if where == "latest":
        def open_failing_on(path, mode="r", *a, **k):
            if os.path.basename(path) == store.LATEST + ".tmp":
                return full_open(path, mode)
            return open(path, mode, *a, **k)
        monkeypatch.setattr(FullFile, "room", 0)
        monkeypatch.setattr(store, "open", open_failing_on, raising=False)
    elif where == "fsync":
        real = store.fsync_dir

        def fsync_failing_on_parent(path):
            if os.path.basename(path) == "checkpoints":
                raise FULL
            real(path)
        monkeypatch.setattr(store, "fsync_dir", fsync_failing_on_parent)
    else:
        def prune(ckpt_dir, keep_last):
            raise FULL
        monkeypatch.setattr(store, "prune", prune)


@pytest.mark.parametrize("where", ["fsync", "latest", "prune"])
def test_an_error_after_the_commit_says_the_step_is_committed_and_resume_uses_it(
        tmp_path, one_rank_group, monkeypatch, where):
    """Issue 40 item 11a: past the rename, the checkpoint is complete; the message must say so
    and which step, never 'not committed'; and the run's continuation is that step."""
    ckpt = str(tmp_path / "checkpoints")
    sharded.save(ckpt, 2, rank_state(), meta(2))
    _fail_after_rename(monkeypatch, where)
    with pytest.raises(InputError) as e:
        sharded.save(ckpt, 4, rank_state(), meta(4), keep_last=1)
    msg = str(e.value)
    assert "not committed" not in msg and "\n" not in msg, msg
    assert msg.startswith(f"checkpoint {ckpt}/step_0000004 is committed (step 4 is complete and "
                          "resume continues from it), but after its commit "), msg
    cause = {"fsync": f"flushing the folder {ckpt} to disk failed ([Errno 28] No space left",
             "latest": f"{ckpt}/latest: no space left on device while writing the pointer",
             "prune": "removing older checkpoints (checkpoint.keep_last=1) failed: [Errno 28]"}
    assert cause[where] in msg, msg
    assert leftovers(ckpt) == []
    found = RunDir(str(tmp_path)).continuation().found
    assert found is not None and found.step == 4


def test_an_error_at_the_rename_itself_says_not_committed_and_removes_the_staging(
        tmp_path, one_rank_group, monkeypatch):
    """The other side of the commit point: a rename that fails leaves nothing committed."""
    ckpt = str(tmp_path / "checkpoints")
    sharded.save(ckpt, 2, rank_state(), meta(2))

    def rename(src, dst):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(store.os, "rename", rename)
    with pytest.raises(InputError) as e:
        sharded.save(ckpt, 4, rank_state(), meta(4))
    msg = str(e.value)
    assert msg.startswith(f"checkpoint {ckpt}/step_0000004 was not committed: "), msg
    assert "is committed" not in msg and "staging-step_0000004 was removed" in msg, msg
    monkeypatch.undo()
    assert sorted(os.listdir(ckpt)) == ["latest", "step_0000002"]
    assert RunDir(str(tmp_path)).continuation().found.step == 2


def test_a_save_record_that_cannot_be_written_says_the_step_is_committed(tmp_path):
    """The save's record in metrics.jsonl comes after the commit: a full disk there names the
    committed step too."""
    from types import SimpleNamespace
    from megatron.training.checkpointer import Checkpointer
    from megatron.training.clock import Deadline

    class FullWriter:
        def write(self, record):
            raise InputError(f"{tmp_path}/metrics.jsonl: no space left on device while "
                             "writing a metrics line")
    ck = Checkpointer.__new__(Checkpointer)
    ck.writer, ck.deadline = FullWriter(), Deadline(0, 0.0, environ={})
    ck.saves, ck.watchdog = collections.deque(maxlen=3), None
    ck.job = SimpleNamespace(run=RunDir(str(tmp_path)))
    with pytest.raises(InputError) as e:
        ck._committed(6, {"bytes": 1e6, "seconds": 1.0}, 0.5, 0.0)
    msg = str(e.value)
    assert msg.startswith(f"checkpoint {tmp_path}/checkpoints/step_0000006 is committed (step 6 "
                          "is complete"), msg
    assert "its save record could not be written" in msg and "metrics.jsonl" in msg, msg
