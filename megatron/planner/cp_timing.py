"""The key/value exchange of ring, all-gather and hybrid context parallelism in the time model
(docs/context_parallel.md "Ring, all-gather and hybrid"; docs/planner.md "Context parallelism").

With (U, R) = Layout.cp_parts (U ranks exchanging heads by Ulysses' all-to-alls, priced in
timing.ulysses_features; R ranks the key/values travel over, spaced tp x U apart), each rank
holds a key/value block of kv = s/C tokens x 2 x its key/value heads x head_dim x bytes
(activations.kv_block_bytes). Per layer, forward:
- ring: R - 1 point-to-point shifts of the block, each overlapped with the block attention of
  the step before it: exposed per step = max(0, transfer - the attention core / R); the
  backward sends the block gradients back the same way (timing counts the exchange twice, and
  once more where recompute replays the attention);
- allgather: one all-gather of the R blocks, bus bytes (R - 1) x kv, before the attention
  (nothing to hide it behind); the backward's reduce-scatter moves the same bus bytes."""
from __future__ import annotations

import numpy as np

from megatron.planner import activations as act
from megatron.planner.features import FEATURES, dot
from megatron.planner.overlap import exposed_share


def kv_exchange_features(x, core: np.ndarray) -> np.ndarray:
    """The forward's key/value exchange of one layer for one micro-batch (x: timing._Ctx; core:
    the attention core's forward features, which a ring step's transfer runs under)."""
    f = np.zeros(len(FEATURES))
    lay = x.lay
    u, r = lay.cp_parts
    if r == 1:
        return f
    block = act.kv_block_bytes(x.m, lay, x.job.precision)
    link = x.spec.link(r, lay.tp * u)
    if lay.cp_algo == "allgather":
        x.collective(f, (r - 1) * block, link)
        return f
    step = np.zeros(len(FEATURES))
    x.collective(step, block, link)
    share = exposed_share(dot(x.th, step), dot(x.th, core) / r)
    return (r - 1) * share * step
