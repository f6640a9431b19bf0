"""Autograd communication primitives for tensor and sequence parallelism, named by direction.

Each is identity when the group has one rank, so the same model code runs unsharded.
"TP region" means the activations sharded across the tensor-parallel group."""
from __future__ import annotations

import torch
import torch.distributed as dist


def _size(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _rank(group) -> int:
    return 0 if group is None else dist.get_rank(group)


def _all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    if _size(group) == 1:
        return x
    x = x.contiguous()
    dist.all_reduce(x, group=group)
    return x


def _split_last(x: torch.Tensor, group) -> torch.Tensor:
    n = _size(group)
    if n == 1:
        return x
    return x.chunk(n, dim=-1)[_rank(group)].contiguous()


def _gather_last(x: torch.Tensor, group) -> torch.Tensor:
    n = _size(group)
    if n == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


def _split_first(x: torch.Tensor, group) -> torch.Tensor:
    n = _size(group)
    if n == 1:
        return x
    return x.chunk(n, dim=0)[_rank(group)].contiguous()


def _rows_like(x: torch.Tensor, rows: int) -> torch.Tensor:
    """An empty tensor of x's dtype, device and trailing shape with `rows` along dim 0."""
    return torch.empty((rows,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)


def _gather_first(x: torch.Tensor, group) -> torch.Tensor:
    n = _size(group)
    if n == 1:
        return x
    out = _rows_like(x, x.shape[0] * n)
    dist.all_gather_into_tensor(out, x.contiguous(), group=group)
    return out


def _reduce_scatter_first(x: torch.Tensor, group) -> torch.Tensor:
    n = _size(group)
    if n == 1:
        return x
    out = _rows_like(x, x.shape[0] // n)
    dist.reduce_scatter_tensor(out, x.contiguous(), group=group)
    return out


def all_gather_first(x: torch.Tensor, group) -> torch.Tensor:
    """All-gather along dim 0 (the sequence), outside autograd."""
    return _gather_first(x, group)


def start_all_reduce(x: torch.Tensor, group):
    """Starts a sum of x across the group in place (x made contiguous); returns (x, work):
    work.wait() before reading x."""
    x = x.contiguous()
    return x, dist.all_reduce(x, group=group, async_op=True)


def start_all_gather_first(x: torch.Tensor, group):
    """Starts the all-gather of x along dim 0; returns (the gathered tensor, work)."""
    out = _rows_like(x, x.shape[0] * _size(group))
    return out, dist.all_gather_into_tensor(out, x.contiguous(), group=group, async_op=True)


def start_reduce_scatter_first(x: torch.Tensor, group):
    """Starts the reduce-scatter of x along dim 0; returns (this rank's slice, work)."""
    out = _rows_like(x, x.shape[0] // _size(group))
    return out, dist.reduce_scatter_tensor(out, x.contiguous(), group=group, async_op=True)


class _CopyToTP(torch.autograd.Function):
    """Forward: identity. Backward: all-reduce the gradient across TP."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g, ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    """Forward: all-reduce partial sums across TP. Backward: identity."""

    @staticmethod
    def forward(ctx, x, group):
        if x.is_leaf or not x.is_contiguous():
            # A leaf is the caller's own tensor (an input or a parameter): reducing it in place
            # would overwrite it, and autograd refuses in-place writes to leaves needing grad.
            return _all_reduce(x.clone(memory_format=torch.contiguous_format), group)
        # In place on the matmul output (no copy on the hot path); autograd is told.
        dist.all_reduce(x, group=group)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class _ScatterToTP(torch.autograd.Function):
    """Forward: keep this rank's slice of the last dim. Backward: all-gather the last dim."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_last(x, group)

    @staticmethod
    def backward(ctx, g):
        return _gather_last(g, ctx.group), None


class _GatherFromTP(torch.autograd.Function):
    """Forward: all-gather the last dim. Backward: keep this rank's slice."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_last(x, group)

    @staticmethod
    def backward(ctx, g):
        return _split_last(g, ctx.group), None


class _ScatterToSP(torch.autograd.Function):
    """Forward: keep this rank's slice of the sequence (dim 0). Backward: all-gather dim 0."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_first(x, group)

    @staticmethod
    def backward(ctx, g):
        return _gather_first(g, ctx.group), None


class _GatherFromSP(torch.autograd.Function):
    """Forward: all-gather the sequence (dim 0). Backward: reduce-scatter dim 0, because the
    consumer of the full sequence is a column-parallel layer whose input gradient is partial."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_first(x, group)

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter_first(g, ctx.group), None


class _GatherToReplicated(torch.autograd.Function):
    """Forward: all-gather the sequence (dim 0). Backward: keep this rank's slice, because the
    consumer of the full sequence is replicated: every rank holds the whole gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_first(x, group)

    @staticmethod
    def backward(ctx, g):
        return _split_first(g, ctx.group), None


class _ReduceScatterToSP(torch.autograd.Function):
    """Forward: reduce-scatter partial sums along dim 0. Backward: all-gather dim 0."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_first(x, group)

    @staticmethod
    def backward(ctx, g):
        return _gather_first(g, ctx.group), None


def copy_to_tp_region(x, group):
    return _CopyToTP.apply(x, group) if _size(group) > 1 else x


def reduce_from_tp_region(x, group):
    return _ReduceFromTP.apply(x, group) if _size(group) > 1 else x


def scatter_to_tp_region(x, group):
    return _ScatterToTP.apply(x, group) if _size(group) > 1 else x


def gather_from_tp_region(x, group):
    return _GatherFromTP.apply(x, group) if _size(group) > 1 else x


def scatter_to_sequence_parallel_region(x, group):
    return _ScatterToSP.apply(x, group) if _size(group) > 1 else x


def gather_from_sequence_parallel_region(x, group):
    return _GatherFromSP.apply(x, group) if _size(group) > 1 else x


def gather_sequence_to_replicated(x, group):
    return _GatherToReplicated.apply(x, group) if _size(group) > 1 else x


def reduce_scatter_to_sequence_parallel_region(x, group):
    return _ReduceScatterToSP.apply(x, group) if _size(group) > 1 else x


# Context parallelism (Ulysses). A rank holds [s/C, b, ...] of C ranks' sequence. The exchange
# is one all_to_all_single (gloo has it; the list form all_to_all only since April 2026) on a
# buffer whose first dim is the C destinations.

def _all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    """x [C, ...]: x[j] goes to rank j; the result's [i] came from rank i."""
    x = x.contiguous()
    out = torch.empty_like(x)  # of x made contiguous: empty_like keeps a permuted input's strides
    dist.all_to_all_single(out, x, group=group)
    return out


def _sequence_to_heads(x: torch.Tensor, group) -> torch.Tensor:
    """[s/C, b, C, n, d] (head chunk j meant for rank j) -> [s, b, n, d]: this rank's head
    chunk over the whole sequence, rank i's positions at [i*s/C, (i+1)*s/C)."""
    s_local, b, c, n, d = x.shape
    out = _all_to_all(x.permute(2, 0, 1, 3, 4), group)  # [C (source), s/C, b, n, d]
    return out.view(c * s_local, b, n, d)


def _heads_to_sequence(x: torch.Tensor, group) -> torch.Tensor:
    """The inverse: [s, b, n, d] -> [s/C, b, C, n, d] (the C ranks' head chunks of this rank's
    positions, in rank order)."""
    c = _size(group)
    s, b, n, d = x.shape
    out = _all_to_all(x.view(c, s // c, b, n, d), group)  # [C (source), s/C, b, n, d]
    return out.permute(1, 2, 0, 3, 4).contiguous()


class _SequenceToHeads(torch.autograd.Function):
    """Forward: all-to-all from [s/C, b, C, n, d] to [s, b, n, d] (scatter heads, gather the
    sequence). Backward: the inverse all-to-all of the gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _sequence_to_heads(x, group)

    @staticmethod
    def backward(ctx, g):
        return _heads_to_sequence(g, ctx.group), None


class _HeadsToSequence(torch.autograd.Function):
    """Forward: all-to-all from [s, b, n, d] to [s/C, b, C, n, d] (scatter the sequence, gather
    heads). Backward: the inverse all-to-all of the gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _heads_to_sequence(x, group)

    @staticmethod
    def backward(ctx, g):
        return _sequence_to_heads(g, ctx.group), None


def all_to_all_sequence_to_heads(x, group):
    """[s/C, b, C, n, d] -> [s, b, n, d]; with one rank a view ([s, b, 1, n, d] -> [s, b, n, d])."""
    return _SequenceToHeads.apply(x, group) if _size(group) > 1 else x.squeeze(2)


def all_to_all_heads_to_sequence(x, group):
    """[s, b, n, d] -> [s/C, b, C, n, d]; with one rank a view."""
    return _HeadsToSequence.apply(x, group) if _size(group) > 1 else x.unsqueeze(2)
