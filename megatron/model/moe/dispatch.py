"""Token dispatch of a MoE layer: the kept assignments sorted by expert, the exchange with the
expert-parallel ranks, and the way back.

    plan      the T x k assignments, slot-major, stably sorted by expert; the capacity rule
              (router.py) drops each expert's assignments past its capacity in that order
    permute   x [T, h] -> [N, h]: one row per kept assignment, grouped by expert
    exchange  (EP > 1) counts per expert are exchanged first (all_to_all_single of [EP, E/EP]),
              then the rows with uneven splits, one all_to_all_single over the ep group
              (torch.distributed.nn.functional, so the backward is the reverse exchange); what a
              rank receives, [source rank][local expert], is regrouped [local expert][source]
    combine   the reverse path, then out[t] = sum over t's kept slots of weight x expert output
              (index_add in the sorted order, the same order in every layout)

Rows are gathered with repeats (a token per kept slot, an expert's bias per row) by
select_rows, whose backward sums the repeats in a fixed order on the CPU too."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.distributed as dist


@dataclass
class Plan:
    tokens: torch.Tensor  # [N] the token of each kept assignment, sorted by expert
    weights: torch.Tensor  # [N] fp32: its combine weight
    counts: torch.Tensor  # [E] kept assignments per expert (this rank's tokens)
    routed: torch.Tensor  # [E] assignments per expert before the capacity rule
    dropped: int  # assignments dropped by the capacity rule


def plan(experts: torch.Tensor, weights: torch.Tensor, num_experts: int,
         capacity: Optional[int]) -> Plan:
    """experts, weights [T, k] -> the kept assignments sorted by expert (slot-major within
    one: every token's first choice before any second choice)."""
    t, k = experts.shape
    flat = experts.t().reshape(-1)  # [k*T] slot-major
    order = torch.sort(flat, stable=True).indices  # grouped by expert, slot-major inside
    routed = torch.bincount(flat, minlength=num_experts)
    dropped = 0
    if capacity is not None:
        sorted_experts = flat[order]
        starts = torch.cumsum(routed, 0) - routed  # where each expert's run begins
        rank_in_expert = torch.arange(order.numel(), device=order.device) - starts[sorted_experts]
        keep = rank_in_expert < capacity
        dropped = int(order.numel() - keep.sum())
        order = order[keep]
    counts = torch.bincount(flat[order], minlength=num_experts)
    return Plan(tokens=order % t, weights=weights.t().reshape(-1)[order], counts=counts,
                routed=routed, dropped=dropped)


def select_rows(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """src[index] along dim 0, where index repeats rows, with a backward that adds each row's
    repeats in a fixed order: index_select on the CPU (its backward, index_add_, adds serially),
    advanced indexing elsewhere (its backward on CUDA, index_put_ with accumulate, sorts the
    indices first). Each other pairing is nondeterministic (torch.use_deterministic_algorithms
    lists both): the CPU's index_put_ with accumulate adds with atomics from every intra-op
    thread once 32768 elements move, so the sums' last bits change from run to run (the
    experts' b1 gradient of tiny.yaml's MoE did, 16 distinct results in 500 on 2 threads, and a
    run's step-4 loss with it); CUDA's index_add_ adds with atomics."""
    if src.device.type == "cpu":
        return src.index_select(0, index)
    return src[index]


def _regroup_order(received: torch.Tensor) -> torch.Tensor:
    """received [EP, L] (rows from each source for each local expert, in that order) -> the
    row order that groups them by local expert, sources in rank order inside."""
    ep, local = received.shape
    segment = torch.repeat_interleave(torch.arange(ep * local, device=received.device),
                                      received.reshape(-1))  # s * L + e of each row
    key = (segment % local) * ep + segment // local  # e * EP + s
    return torch.sort(key, stable=True).indices


@dataclass
class Exchange:
    """What the way back needs: the split sizes both ways and the regrouping."""
    send: List[int]
    recv: List[int]
    order: torch.Tensor  # regrouped row i is received row order[i]
    per_expert: List[int]  # rows per local expert after regrouping


def _all_to_all(x: torch.Tensor, out_splits: List[int], in_splits: List[int], group):
    from torch.distributed.nn.functional import all_to_all_single
    out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
    return all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)


def send_to_experts(rows: torch.Tensor, counts: torch.Tensor, ep: int, group):
    """rows [N, h] sorted by global expert, counts [E] -> (this rank's rows [M, h] grouped by
    local expert, Exchange). With ep = 1 the rows stay."""
    if ep == 1:
        return rows, Exchange([], [], None, counts.tolist())
    local = counts.numel() // ep
    mine = counts.view(ep, local)  # [destination, local expert]
    received = torch.empty_like(mine)
    dist.all_to_all_single(received, mine.contiguous(), group=group)  # [source, local expert]
    send, recv = mine.sum(1).tolist(), received.sum(1).tolist()
    out = _all_to_all(rows, recv, send, group)
    order = _regroup_order(received)
    return out[order], Exchange(send, recv, order, received.sum(0).tolist())


def return_from_experts(rows: torch.Tensor, ex: Exchange, ep: int, group) -> torch.Tensor:
    """The inverse of send_to_experts: [M, h] grouped by local expert -> [N, h] in this rank's
    sorted order."""
    if ep == 1:
        return rows
    back = torch.empty_like(ex.order)
    back[ex.order] = torch.arange(ex.order.numel(), device=ex.order.device)
    return _all_to_all(rows[back], ex.send, ex.recv, group)


def combine(rows: torch.Tensor, p: Plan, tokens: int) -> torch.Tensor:
    """rows [N, h] (expert outputs in the plan's order) -> [T, h]: each token's weighted sum."""
    weighted = rows * p.weights.unsqueeze(-1).to(rows.dtype)
    out = rows.new_zeros((tokens, rows.shape[-1]))
    return out.index_add(0, p.tokens, weighted)
