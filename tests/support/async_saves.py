"""A rank's state made by hand for the tests of asynchronous saves (the CPU ones in
tests/unit/test_checkpoint_async_save.py, the CUDA snapshot path in
tests/gpu/test_training_gpu_paths.py), and the helpers that save and read it."""
import os

import torch

from megatron.base import store
from megatron.checkpoint import sharded, snapshot
from megatron.base.records import CheckpointMeta
from megatron.checkpoint.state import Fragment, LocalParam, Partition, RankState
from megatron.parallel.state import RankCoord
from tests.support.checkpoints import meta_json

SIZES = (3000, 17, 70000, 1, 5 << 20)  # one piece above snapshot.WRITEBACK_MIN


def flat_state(seed=0, device="cpu"):
    """Pieces as views into three flat fp32 buffers, as DeepSpeed's partitions are (on `device`: on
    "cuda" a background save takes the pinned-buffer, side-stream snapshot path)."""
    g = torch.Generator().manual_seed(seed)
    flats = [torch.randn(sum(SIZES), generator=g).to(device) for _ in range(3)]
    params, at = [], 0
    for i, n in enumerate(SIZES):
        m, a, b = (f.narrow(0, at, n) for f in flats)
        params.append(LocalParam(f"p{i}", (n,), Partition(),
                                 fragments=[Fragment(0, n, m, {"exp_avg": a, "exp_avg_sq": b})]))
        at += n
    return RankState(params, True, RankCoord(0, 0, 0), {"cpu": torch.get_rng_state()}), flats


def meta(step):
    return CheckpointMeta.from_json(meta_json(step, {}))


def files_of(folder):
    shard = os.path.join(folder, sharded.shard_file(RankCoord(0, 0, 0)))
    with open(shard, "rb") as f, open(os.path.join(folder, store.INDEX), "rb") as g:
        return f.read(), g.read()


def background(ckpt, step, rs, buffers):
    pending = sharded.PendingSave(ckpt, step, rs, meta(step), 0, buffers)
    pending.start_writer()
    return pending


def check_background_saves(tmp_path, rs, flats) -> dict:
    """Saves `rs` at step 5 synchronously and in the background, overwriting the state (the
    optimizer's next update) as soon as the copy is reported done; then at step 6 both ways
    again through the same, reused host buffers. Asserts that each background checkpoint is byte
    for byte the synchronous one (shard and index.json) and returns the first save's record."""
    sharded.save(str(tmp_path / "sync"), 5, rs, meta(5))
    buffers = snapshot.Buffers()
    pending = background(str(tmp_path / "async"), 5, rs, buffers)
    pending.wait_copied()
    for f in flats:
        f.mul_(-3.0)
    pending.join()
    record = pending.finish()
    sync, done = files_of(str(tmp_path / "sync/step_0000005")), \
        files_of(str(tmp_path / "async/step_0000005"))
    assert sync[0] == done[0], "the shard written in the background differs"
    assert sync[1] == done[1], "index.json differs"
    sharded.save(str(tmp_path / "sync"), 6, rs, meta(6))
    again = background(str(tmp_path / "async"), 6, rs, buffers)
    again.join()
    again.finish()
    assert files_of(str(tmp_path / "sync/step_0000006")) == \
        files_of(str(tmp_path / "async/step_0000006")), "the second background save differs"
    return record
