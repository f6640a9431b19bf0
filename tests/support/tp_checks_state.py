"""Tensor-parallel checks of state rather than layers, run by tp_layers_worker.py: the RNG
tracker's streams, recompute replaying them exactly, and the rank grid against DeepSpeed's."""
from __future__ import annotations

import os
import sys
from typing import Dict, List

import torch
import torch.distributed as dist
import torch.nn.functional as F

from megatron.parallel.checkpointing import recompute
from megatron.parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.parallel.random import build_tracker, dropout
from megatron.engine.mpu import DeepSpeedMPU
from megatron.parallel.state import ParallelState

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tp_check_support import (B, IN, OUT, S, Report, gather_group, leaf,  # noqa: E402
                              randn, seq_chunk)


def _mask(n: int = 256) -> torch.Tensor:
    return F.dropout(torch.ones(n), 0.5, True)


def check_rng_tracker(st: ParallelState) -> None:
    rep = Report()
    tracker = build_tracker(1234, st.tp_rank, st.pp_rank, torch.device("cpu"))
    default = _mask()
    before = torch.get_rng_state()
    with tracker.fork("tp"):
        sharded = _mask()
    rep.true("fork must restore the default generator's state",
             torch.equal(before, torch.get_rng_state()))
    with tracker.fork("tp"):
        sharded2 = _mask()
    rep.true("a second fork must continue the tp stream, not restart it",
             not torch.equal(sharded, sharded2))
    via_dropout = dropout(torch.ones(256), 0.5, True, True, tracker)
    fresh = build_tracker(1234, st.tp_rank, st.pp_rank, torch.device("cpu"))
    _mask()
    with fresh.fork("tp"):
        again = _mask()
    rep.true("the tp stream must be reproducible from the seed", torch.equal(sharded, again))
    defaults = gather_group(default, st.tp_group)
    shardeds = gather_group(torch.stack([sharded, via_dropout]), st.tp_group)
    rep.true("default-stream dropout must be identical across TP ranks",
             all(torch.equal(defaults[0], d) for d in defaults))
    rep.true("tp-stream dropout must differ between TP ranks",
             all(not torch.equal(shardeds[i][k], shardeds[j][k]) for k in (0, 1)
                 for i in range(st.tp) for j in range(i)))
    if st.pp > 1:
        stages = gather_group(default, st.pp_group)
        rep.true("default-stream dropout must differ between pipeline stages",
                 not torch.equal(stages[0], stages[1]))
    if st.dp > 1:
        replicas = gather_group(torch.stack([default, sharded]), st.dp_group)
        rep.true("data-parallel replicas at the same grid position must draw the same masks",
                 all(torch.equal(replicas[0], x) for x in replicas))
    rep.raise_if_failed()


def _grads(params, x) -> List[torch.Tensor]:
    return [p.grad.clone() for p in params] + [x.grad.clone()]


def _run_block(fn, params, x, grad, tracker, snap, use_recompute: bool):
    tracker.restore(snap)
    for p in params:
        p.grad = None
    x = leaf(x)
    y = recompute(fn, x, tracker) if use_recompute else fn(x)
    y.backward(grad)
    return y.detach(), _grads(params, x), tracker.snapshot()


def _same_snapshot(a, b) -> bool:
    return torch.equal(a[0], b[0]) and a[1].keys() == b[1].keys() and all(
        torch.equal(a[1][k], b[1][k]) for k in a[1])


def check_recompute(st: ParallelState, *, sequence_parallel=False) -> None:
    """recompute(fn) == fn, gradients included, with dropout on both the default and the tp
    stream inside fn; and afterwards the random states are where the plain run left them."""
    rep = Report()
    tracker = build_tracker(99, st.tp_rank, st.pp_rank, torch.device("cpu"))
    col = ColumnParallelLinear(IN, OUT, st, sequence_parallel=sequence_parallel, init_std=0.5,
                               init_seed=71)
    row = RowParallelLinear(OUT, IN, st, sequence_parallel=sequence_parallel, init_std=0.5,
                            init_seed=72)
    with torch.no_grad():
        col.bias.normal_(generator=torch.Generator().manual_seed(73))
        row.bias.normal_(generator=torch.Generator().manual_seed(74))
    params = [col.weight, col.bias, row.weight, row.bias]
    sp = sequence_parallel and st.tp > 1

    def block(h):
        h = F.gelu(col(h))
        h = dropout(h, 0.3, True, True, tracker)  # sharded activations: tp stream
        return dropout(row(h), 0.3, True, sp, tracker)  # replicated (or SP-sharded) output

    x, grad = randn(S, B, IN, seed=75), randn(S, B, IN, seed=76)
    if sequence_parallel:
        x, grad = seq_chunk(x, st), seq_chunk(grad, st)
    snap = tracker.snapshot()
    y0, g0, after0 = _run_block(block, params, x, grad, tracker, snap, False)
    y1, g1, after1 = _run_block(block, params, x, grad, tracker, snap, True)
    rep.close("forward output", y1, y0, 0, 0)
    for label, a, b in zip(["column weight", "column bias", "row weight", "row bias", "input"],
                           g1, g0):
        rep.close(f"{label} grad", a, b, 0, 0)
    rep.true("random states after recompute must equal those after the plain run",
             _same_snapshot(after0, after1))
    # Sensitivity: without the tracker the replay draws fresh masks, so gradients must differ;
    # if they did not, dropout would not be exercised and the comparison above proves nothing.
    _, g2, _ = _run_block(block, params, x, grad, tracker, snap, False)
    tracker.restore(snap)
    for p in params:
        p.grad = None
    x2 = leaf(x)
    recompute(block, x2, None).backward(grad)
    rep.true("replaying without the tracker should change the gradients (dropout inactive?)",
             not torch.equal(x2.grad, g2[-1]))
    rep.raise_if_failed()


# ------------------------------------------------------------------------------------ grid


def _members(group) -> List[int]:
    """Ranks of `group`, found with a collective (one-hot all-reduce), not from bookkeeping."""
    onehot = torch.zeros(dist.get_world_size())
    onehot[dist.get_rank()] = 1.0
    dist.all_reduce(onehot, group=group)
    return [i for i, v in enumerate(onehot.tolist()) if v]


def check_grid(st: ParallelState, expect: Dict[str, List[List[int]]]) -> None:
    """expect: for each axis, the list of its groups; this rank must sit in the one holding it."""
    rep, rank = Report(), dist.get_rank()
    for axis in ("tp", "dp", "pp", "mp"):
        group = getattr(st, f"{axis}_group")
        want = next(g for g in expect[axis] if rank in g)
        got = _members(group)
        rep.true(f"{axis} group of rank {rank}: collective reached {got}, expected {want}",
                 got == want)
        listed = dist.get_process_group_ranks(group)
        rep.true(f"{axis} group of rank {rank}: holds ranks {listed}, expected {want}",
                 sorted(listed) == want)
    tp_group = next(g for g in expect["tp"] if rank in g)
    dp_group = next(g for g in expect["dp"] if rank in g)
    pp_group = next(g for g in expect["pp"] if rank in g)
    coords = (st.tp_rank, st.dp_rank, st.pp_rank)
    want_coords = (tp_group.index(rank), dp_group.index(rank), pp_group.index(rank))
    rep.true(f"coordinates (tp, dp, pp) {coords}, expected {want_coords}", coords == want_coords)
    rep.true(f"pp_ranks {st.pp_ranks}, expected {pp_group}", st.pp_ranks == pp_group)
    rep.true("first/last stage flags", (st.is_first_stage, st.is_last_stage) ==
             (st.pp_rank == 0, st.pp_rank == len(pp_group) - 1))
    mpu = DeepSpeedMPU(st)
    rep.true("DeepSpeedMPU ranks and sizes", (
        mpu.get_model_parallel_rank(), mpu.get_data_parallel_rank(),
        mpu.get_pipeline_model_parallel_rank(), mpu.get_model_parallel_world_size(),
        mpu.get_data_parallel_world_size(), mpu.get_pipeline_model_parallel_world_size())
        == want_coords + (len(tp_group), len(dp_group), len(pp_group)))
    rep.raise_if_failed()


GRIDS_4 = {
    # tp varies fastest, then dp, then pp
    "tp2pp2": (2, 2, {"tp": [[0, 1], [2, 3]], "dp": [[0], [1], [2], [3]],
                      "pp": [[0, 2], [1, 3]], "mp": [[0, 1, 2, 3]]}),
    "tp2dp2": (2, 1, {"tp": [[0, 1], [2, 3]], "dp": [[0, 2], [1, 3]],
                      "pp": [[0], [1], [2], [3]], "mp": [[0, 1], [2, 3]]}),
    "dp2pp2": (1, 2, {"tp": [[0], [1], [2], [3]], "dp": [[0, 1], [2, 3]],
                      "pp": [[0, 2], [1, 3]], "mp": [[0, 2], [1, 3]]}),
    "tp4": (4, 1, {"tp": [[0, 1, 2, 3]], "dp": [[0], [1], [2], [3]],
                   "pp": [[0], [1], [2], [3]], "mp": [[0, 1, 2, 3]]}),
}
GRIDS_2 = {
    "tp2": (2, 1, {"tp": [[0, 1]], "dp": [[0], [1]], "pp": [[0], [1]], "mp": [[0, 1]]}),
    "pp2": (1, 2, {"tp": [[0], [1]], "dp": [[0], [1]], "pp": [[0, 1]], "mp": [[0, 1]]}),
}
