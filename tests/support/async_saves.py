"""A rank's state made by hand for the tests of asynchronous saves (the CPU ones in
tests/unit/test_checkpoint_async_save.py, the CUDA snapshot path in
tests/gpu/test_training_gpu_paths.py), and the helpers that save and read it."""
import os

import torch

from megatron.checkpoint import sharded, store
from megatron.checkpoint.records import CheckpointMeta
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
