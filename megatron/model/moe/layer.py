"""A MoE layer in place of the dense MLP: route, dispatch, experts, combine (docs/moe.md).

    x [s, b, h] -> tokens [T = s*b, h] -> router -> plan (sort by expert, capacity) -> permute
    -> exchange over the ep group (EP > 1) -> experts -> reverse exchange -> weighted combine
    -> [s, b, h]  (+ the shared expert's MLP of every token, model.moe_shared_expert_ffn_hidden_size)

The router's auxiliary losses are kept on the layer (`take_losses`) for GPTModel to add to the
loss it returns, so they reach the backward; the numbers a loop may log are in `stats`: the
last forward's, or in training, summed over the forwards since `take_stats` (a logged step's
window of micro-batches), as detached tensors read only when asked, so no step waits for them."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from megatron.config import moe
from megatron.model.mlp import MLP
from megatron.model.moe.dispatch import (combine, plan, return_from_experts, send_to_experts)
from megatron.model.moe.experts import Experts
from megatron.model.moe.router import Router, capacity


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

    def as_dict(self) -> dict:
        """Losses: the mean per forward; load: tokens (assignments before the capacity rule)
        per expert, max and mean over the experts; the share of assignments dropped."""
        routed = self.routed.float()
        n = self.forwards
        return {"aux_loss": float(self.aux_loss) / n, "z_loss": float(self.z_loss) / n,
                "tokens_per_expert_max": float(routed.max()),
                "tokens_per_expert_mean": float(routed.mean()),
                "dropped_fraction": self.dropped / max(1, self.assignments)}


class MoELayer(nn.Module):
    def __init__(self, m, ctx, layer_number: int):
        super().__init__()
        expert = ctx.expert
        self.ep = expert.size if expert is not None else 1
        self.group = expert.ep_group if expert is not None else None
        local = m.num_experts // self.ep
        first = (expert.index if expert is not None else 0) * local
        self.num_experts, self.k, self.factor = m.num_experts, m.moe_top_k, m.moe_capacity_factor
        self.router = Router(m, ctx, layer_number)
        self.experts = Experts(m, ctx, layer_number, first, local)
        # Replicated like any dense MLP (not marked as experts), its own seed streams.
        self.shared_expert = MLP(dataclasses.replace(m, ffn_hidden_size=moe.shared_ffn(m)), ctx,
                                 layer_number, "shared_expert.") if moe.shared_ffn(m) else None
        self._losses: Optional[torch.Tensor] = None
        self.stats: Optional[LayerStats] = None
        self._window: Optional[LayerStats] = None  # training forwards since take_stats

    def take_losses(self) -> Optional[torch.Tensor]:
        """The auxiliary losses of the last forward (None after they were taken)."""
        losses, self._losses = self._losses, None
        return losses

    def take_stats(self) -> Optional[LayerStats]:
        """The training forwards' stats since the last call (None when none ran)."""
        window, self._window = self._window, None
        return window

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [s, b, h] -> same
        s, b, h = x.shape
        tokens = x.reshape(s * b, h)  # [T, h]
        routing = self.router(tokens)
        cap = capacity(s * b, self.k, self.num_experts, self.factor)
        p = plan(routing.experts, routing.weights, self.num_experts, cap)
        rows, ex = send_to_experts(tokens[p.tokens], p.counts, self.ep, self.group)  # [M, h]
        rows = self.experts(rows, ex.per_expert)
        rows = return_from_experts(rows, ex, self.ep, self.group)  # [N, h]
        self._losses = routing.aux_loss + routing.z_loss
        self.stats = LayerStats(routing.aux_loss.detach(), routing.z_loss.detach(), p.routed,
                                p.dropped, routing.experts.numel())
        if self.training:
            self._window = self.stats if self._window is None else self._window.add(self.stats)
        out = combine(rows, p, s * b).view(s, b, h)
        return out if self.shared_expert is None else out + self.shared_expert(x)
