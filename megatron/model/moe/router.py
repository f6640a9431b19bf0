"""The router of a MoE layer: token-choice top-k over E experts, in fp32, its two auxiliary
losses (taken by the layer, over the whole micro-batch: model/moe/layer.py) and the capacity
rule.

    logits = x W^T                  x [T, h], W [E, h] (no bias, replicated), fp32
    softmax router: p = softmax(logits); weights, experts = top_k(p)        (not renormalised)
    softmax_renorm: the same experts, weights = top_k(p) / their sum  (Mixtral's router: a
                    softmax over the k chosen logits)
    sigmoid router: q = sigmoid(logits); weights, experts = top_k(q) / their sum; p = q / sum(q)
    aux loss  = coeff x E x sum_e f_e x P_e   (Switch/GShard): f_e the share of the T x k
                assignments that chose e (before any drop), P_e the mean of p[:, e] over tokens
    z-loss    = coeff x mean_t(logsumexp(logits_t)^2)  (ST-MoE)

Capacity (model.moe_capacity_factor c, null: dropless): an expert takes at most
ceil(T x k / E x c) assignments of this rank's T tokens. The drop policy: assignments are ranked
slot-major, every token's first choice (in token order) before any token's second choice, and
each expert keeps its first `capacity` in that order; a dropped assignment contributes nothing
(the token keeps its other experts' outputs, and the residual). The same order is the dispatch's
sort, so the rule costs one stable sort."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from megatron.parallel.layers import replicated_param, sharded_normal
from megatron.parallel.random import seed_for


@dataclass
class Routing:
    """One forward's routing of T tokens, k slots each, over E experts."""
    experts: torch.Tensor  # [T, k] int64: the chosen experts, best first
    weights: torch.Tensor  # [T, k] fp32: their combine weights
    probs: torch.Tensor  # [T, E] fp32: the probabilities the balancing loss reads
    logits: torch.Tensor  # [T, E] fp32: what the z-loss reads


def top_k(logits: torch.Tensor, k: int, router: str):
    """logits [T, E] fp32 -> (weights [T, k], experts [T, k], probabilities p [T, E])."""
    if router == "sigmoid":
        scores = torch.sigmoid(logits)
        weights, experts = scores.topk(k, dim=-1)
        return weights / weights.sum(-1, keepdim=True), experts, \
            scores / scores.sum(-1, keepdim=True)
    probs = torch.softmax(logits, dim=-1)
    weights, experts = probs.topk(k, dim=-1)
    if router == "softmax_renorm":
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, experts, probs


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor, coeff: float) -> torch.Tensor:
    """coeff x E x sum_e f_e P_e; probs [T, E], experts [T, k]."""
    t, e = probs.shape
    counts = torch.bincount(experts.reshape(-1), minlength=e).to(probs.dtype)
    fraction = counts / experts.numel()  # f_e: share of the T x k assignments
    return coeff * e * torch.sum(fraction * probs.mean(0))


def z_loss(logits: torch.Tensor, coeff: float) -> torch.Tensor:
    return coeff * torch.logsumexp(logits, dim=-1).square().mean()


def capacity(tokens: int, k: int, experts: int, factor: Optional[float]) -> Optional[int]:
    """Assignments one expert keeps of `tokens` tokens; None: dropless."""
    if factor is None:
        return None
    return math.ceil(tokens * k / experts * factor)


class Router(nn.Module):
    def __init__(self, m, ctx, layer_number: int):
        super().__init__()
        self.k, self.kind = m.moe_top_k, m.moe_router
        # Under TP every rank routes other tokens (model/moe/layer.py): sum the gradient.
        self.state, self.tokens_split = ctx.state, ctx.state.tp > 1
        # [E, h], one seeded stream per line like every weight: the same in every layout.
        self.weight = nn.Parameter(sharded_normal(
            (m.num_experts, m.hidden_size), m.init_method_std,
            seed_for(ctx.seed, f"layer{layer_number}.router")))

    def forward(self, x: torch.Tensor) -> Routing:  # x [T, h]
        # fp32 whatever the model's precision: the top-k choice and the losses are sensitive
        # to rounding of near-equal logits.
        w = replicated_param(self.weight, self.state, self.tokens_split)
        logits = F.linear(x.float(), w.float())  # [T, E]
        weights, experts, probs = top_k(logits, self.k, self.kind)
        return Routing(experts, weights, probs, logits)
