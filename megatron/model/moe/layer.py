"""A MoE layer in place of the dense MLP: route, dispatch, experts, combine (docs/moe.md).

    x [s, b, h] -> tokens [T = s*b, h] -> router -> plan (sort by expert, capacity) -> permute
    -> exchange over the ep group (EP > 1) -> experts -> reverse exchange -> weighted combine
    -> [s, b, h]  (+ the shared expert's MLP of every token, model.moe.shared_expert_ffn_hidden_size)

Tokens: under tensor parallelism the layer works on this rank's share of the sequence: the
sequence-parallel shard it is given, or without sequence parallelism its 1/t slice of the
replicated input, gathered back after the combine. Context-parallel ranks hold their own share.
So every rank of the tp x cp group routes different tokens of the same micro-batch; the
auxiliary losses are taken over the whole micro-batch by one all-reduce of the routing's sums
over that group (`token_group`), so they are the one-rank values in every layout.

The auxiliary losses reach the backward without joining the loss: the output carries them
(_AttachAux), and its backward hands them the gradient `aux_grad_scale` (the engine sets the
loss scale over the gradient-accumulation steps, what the language-model loss's gradient is
scaled by), so they work on every pipeline stage and under full recomputation, and the
logged loss is the language-model loss. The numbers a loop may log are in `stats`: the last
forward's, or in training, summed over the forwards since `take_stats` (a logged step's window
of micro-batches), as detached tensors read only when asked, so no step waits for them."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from megatron.config import moe
from megatron.model.mlp import MLP
from megatron.model.moe.dispatch import (combine, plan, return_from_experts, select_rows,
                                         send_to_experts)
from megatron.model.moe.experts import Experts
from megatron.model.moe.router import Router, Routing, capacity, load_balancing_loss, z_loss
from megatron.parallel.mappings import (gather_sequence_to_replicated,
                                        scatter_to_sequence_parallel_region)


@dataclass
class LayerStats:
    """One forward of one MoE layer, detached: losses with their coefficients, and the load."""
    aux_loss: torch.Tensor
    z_loss: torch.Tensor
    routed: torch.Tensor  # [E] assignments per expert before the capacity rule
    dropped: int
    assignments: int

    forwards: int = 1  # aux_loss and z_loss are sums over this many forwards

    def add(self, other: "LayerStats") -> "LayerStats":
        return LayerStats(self.aux_loss + other.aux_loss, self.z_loss + other.z_loss,
                          self.routed + other.routed, self.dropped + other.dropped,
                          self.assignments + other.assignments, self.forwards + other.forwards)

    def summed_over(self, group) -> "LayerStats":
        """The same numbers summed over the ranks of `group` (collective): the data-parallel
        replicas, so a logged step's window covers its whole global batch."""
        e = self.routed.numel()
        flat = torch.cat([self.routed.double(), torch.tensor(
            [float(self.aux_loss), float(self.z_loss), self.dropped, self.assignments,
             self.forwards], dtype=torch.float64)])
        dist.all_reduce(flat, group=group)
        routed, (aux, z, dropped, assignments, forwards) = flat[:e], flat[e:].tolist()
        return LayerStats(torch.tensor(aux), torch.tensor(z), routed.round().long(),
                          int(round(dropped)), int(round(assignments)), int(round(forwards)))

    def as_dict(self) -> dict:
        """Losses: the mean per forward; load: tokens (assignments before the capacity rule)
        per expert, max and mean over the experts; the share of assignments dropped."""
        routed = self.routed.float()
        n = self.forwards
        return {"aux_loss": float(self.aux_loss) / n, "z_loss": float(self.z_loss) / n,
                "tokens_per_expert_max": float(routed.max()),
                "tokens_per_expert_mean": float(routed.mean()),
                "dropped_fraction": self.dropped / max(1, self.assignments)}


class _AttachAux(torch.autograd.Function):
    """Forward: y unchanged. Backward: y's gradient, and `scale` for the auxiliary losses, as if
    they had been added to the loss (scaled as the loss is)."""

    @staticmethod
    def forward(ctx, y, losses, scale):
        # what the losses' gradient looks like, not the tensor (no reference to the graph)
        ctx.scale, ctx.spec = scale, (losses.shape, losses.dtype, losses.device)
        return y

    @staticmethod
    def backward(ctx, g):
        shape, dtype, device = ctx.spec
        return g, torch.full(shape, ctx.scale, dtype=dtype, device=device), None


class MoELayer(nn.Module):
    def __init__(self, m, ctx, layer_number: int):
        super().__init__()
        expert, state = ctx.expert, ctx.state
        self.ep = expert.size if expert is not None else 1
        self.group = expert.ep_group if expert is not None else None
        local = m.moe.num_experts // self.ep
        first = (expert.index if expert is not None else 0) * local
        self.num_experts, self.k, self.factor = m.moe.num_experts, m.moe.top_k, m.moe.capacity_factor
        self.aux_coeff, self.z_coeff = m.moe.aux_loss_coeff, m.moe.z_loss_coeff
        # Without sequence parallelism the input is replicated over TP: take this rank's slice.
        self.tp_group = state.tp_group if state.tp > 1 and not ctx.sequence_parallel else None
        # The ranks that split one micro-batch's tokens; cp: each rank's loss is the mean over
        # its own share, averaged over the cp ranks by the engine (GPTModel's lm_loss).
        self.token_group = state.group("tp_cp") if state.tp * state.cp > 1 else None
        self.cp = state.cp
        self.recomputed = ctx.recompute == "full"
        self.router = Router(m, ctx, layer_number)
        self.experts = Experts(m, ctx, layer_number, first, local)
        self.aux_grad_scale = 1.0  # set by the engine each step (engine/experts.py)
        # Replicated like any dense MLP (not marked as experts), its own seed streams.
        self.shared_expert = MLP(dataclasses.replace(m, ffn_hidden_size=moe.shared_ffn(m)), ctx,
                                 layer_number, "shared_expert.") if moe.shared_ffn(m) else None
        self.stats: Optional[LayerStats] = None
        self._window: Optional[LayerStats] = None  # training forwards since take_stats

    def take_stats(self) -> Optional[LayerStats]:
        """The training forwards' stats since the last call (None when none ran)."""
        window, self._window = self._window, None
        return window

    def _losses(self, r: Routing, tokens: int, dropped: int):
        """(this rank's auxiliary losses for the backward, the stats of the whole micro-batch).
        One rank: the Switch/GShard loss and the z-loss of its tokens. Over a token group of
        T tokens in all, f_e (the share of assignments to e) is the group's, and this rank's
        part is c x coeff x E x sum_e f_e x sum_{t here} p_te / T (c: cp), which summed over
        tp ranks (their router gradients are summed) and averaged over cp ranks (the engine)
        is the loss of the whole micro-batch; the z-loss alike."""
        e, zero = self.num_experts, r.logits.new_zeros(())
        counts = torch.bincount(r.experts.reshape(-1), minlength=e)
        if self.token_group is None:
            aux = load_balancing_loss(r.probs, r.experts, self.aux_coeff) \
                if self.aux_coeff else zero
            z = z_loss(r.logits, self.z_coeff) if self.z_coeff else zero
            return aux + z, LayerStats(aux.detach(), z.detach(), counts, dropped,
                                       r.experts.numel())
        lse2 = torch.logsumexp(r.logits, dim=-1).square()  # [T_here]
        psum = r.probs.sum(0)  # [E]
        sums = torch.cat([counts.to(psum.dtype), psum.detach(), lse2.detach().sum().view(1),
                          psum.new_tensor([tokens, dropped])])
        dist.all_reduce(sums, group=self.token_group)
        g_counts, g_psum, g_lse2, g_tokens, g_dropped = sums.split([e, e, 1, 1, 1])
        total = float(g_tokens)
        f = g_counts / (total * self.k)
        aux = self.cp * self.aux_coeff * e * torch.sum(f * psum) / total \
            if self.aux_coeff else zero
        z = self.cp * self.z_coeff * lse2.sum() / total if self.z_coeff else zero
        whole_aux = self.aux_coeff * e * torch.sum(f * g_psum) / total
        whole_z = self.z_coeff * g_lse2[0] / total
        return aux + z, LayerStats(whole_aux, whole_z, g_counts.round().long(),
                                   int(g_dropped), int(total) * self.k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [s, b, h] -> same
        given = x  # the shared expert is a dense MLP: it takes the layer's input as given
        if self.tp_group is not None:
            x = scatter_to_sequence_parallel_region(x, self.tp_group)
        s, b, h = x.shape
        tokens = x.reshape(s * b, h)  # [T, h]
        routing = self.router(tokens)
        cap = capacity(s * b, self.k, self.num_experts, self.factor)
        p = plan(routing.experts, routing.weights, self.num_experts, cap)
        rows, ex = send_to_experts(select_rows(tokens, p.tokens), p.counts, self.ep,
                                  self.group)  # [M, h]
        rows = self.experts(rows, ex.per_expert)
        rows = return_from_experts(rows, ex, self.ep, self.group)  # [N, h]
        losses, self.stats = self._losses(routing, s * b, p.dropped)
        # Under full recomputation the layer runs twice: count the first (no-grad) forward.
        if self.training and not (self.recomputed and torch.is_grad_enabled()):
            self._window = self.stats if self._window is None else self._window.add(self.stats)
        y = combine(rows, p, s * b)
        if self.training and torch.is_grad_enabled() and losses.requires_grad:
            y = _AttachAux.apply(y, losses, self.aux_grad_scale)
        y = y.view(s, b, h)
        if self.tp_group is not None:
            y = gather_sequence_to_replicated(y, self.tp_group)
        return y if self.shared_expert is None else y + self.shared_expert(given)
