"""Point-to-point rotation around a ring of ranks (ring attention's key/value blocks).

ring_shift: forward, each rank sends its tensor to the next rank of the group and receives the
previous rank's; backward, the gradient travels the other way (sent to the previous rank,
received from the next), so the gradient of a block lands on the rank that sent it. Ring
attention built from it (model/context_attention.py) has its backward ring by construction:
autograd replays the shifts in reverse order on every rank, the same order on all of them
because each shift's input is the previous shift's output."""
from __future__ import annotations

import torch
import torch.distributed as dist


def _exchange(x: torch.Tensor, to: int, source: int, group) -> torch.Tensor:
    """Sends x to group rank `to` and returns what group rank `source` sent (same shape). Both
    posted before either waits, so a ring of any size (2 too: to == source) cannot deadlock."""
    x = x.contiguous()
    out = torch.empty_like(x)
    send = dist.isend(x, group=group, group_dst=to)
    recv = dist.irecv(out, group=group, group_src=source)
    send.wait()
    recv.wait()
    return out


class _RingShift(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        ctx.next, ctx.prev = (rank + 1) % size, (rank - 1) % size
        return _exchange(x, ctx.next, ctx.prev, group)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad, ctx.prev, ctx.next, ctx.group), None


def ring_pass(x: torch.Tensor, group) -> torch.Tensor:
    """x to the next rank of `group`, the previous rank's x back; no autograd (the explicit
    backward of ring attention moves key/value blocks and their gradients with it)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    return _exchange(x, (rank + 1) % size, (rank - 1) % size, group)


def ring_shift(x: torch.Tensor, group) -> torch.Tensor:
    """x from this rank -> x of the previous rank of `group` (autograd: gradient goes back)."""
    return _RingShift.apply(x, group)
