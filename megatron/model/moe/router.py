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

Auxiliary-loss-free balancing (DeepSeek-V3; model.moe.router_bias_update_rate u > 0): a bias
b [E] (a buffer, not trained by the optimizer) is added to the scores (p, or q for sigmoid) for
the top-k choice only; the weights stay the unbiased scores of the chosen experts. After each
optimizer step, b_e += u x sign(mean_e(load) - load_e), the load counted over the step's
training forwards and summed over the data-parallel ranks (update_bias), so every rank keeps
the same b.

Capacity (model.moe.capacity_factor c, null: dropless): an expert takes at most
ceil(T x k / E x c) assignments of this rank's T tokens. The drop policy: assignments are ranked
slot-major, every token's first choice (in token order) before any token's second choice, and
each expert keeps its first `capacity` in that order; a dropped assignment contributes nothing
(the token keeps its other experts' outputs, and the residual). The same order is the dispatch's
sort, so the rule costs one stable sort."""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from megatron.parallel.layers import replicated_param, sharded_normal
from megatron.parallel.random import seed_for


class Routing(NamedTuple):
    """One forward's routing of T tokens, k slots each, over E experts. A named tuple, not a
    dataclass: ZeRO-3's module hooks find the tensors of a module's output only in tuples,
    lists and dicts, and the router's weight must be gathered again for its backward."""
    experts: torch.Tensor  # [T, k] int64: the chosen experts, best first
    weights: torch.Tensor  # [T, k] fp32: their combine weights
    probs: torch.Tensor  # [T, E] fp32: the probabilities the balancing loss reads
    logits: torch.Tensor  # [T, E] fp32: what the z-loss reads


def _choose(scores: torch.Tensor, k: int, bias: Optional[torch.Tensor]):
    """The top k of scores [T, E] (of scores + bias when a bias is given, the weights still
    the unbiased scores) -> (weights [T, k], experts [T, k])."""
    if bias is None:
        return scores.topk(k, dim=-1)
    experts = (scores + bias).topk(k, dim=-1).indices
    return scores.gather(-1, experts), experts


def top_k(logits: torch.Tensor, k: int, router: str, bias: Optional[torch.Tensor] = None):
    """logits [T, E] fp32 -> (weights [T, k], experts [T, k], probabilities p [T, E]); bias
    [E]: added to the scores for the choice only (auxiliary-loss-free balancing)."""
    if router == "sigmoid":
        scores = torch.sigmoid(logits)
        weights, experts = _choose(scores, k, bias)
        return weights / weights.sum(-1, keepdim=True), experts, \
            scores / scores.sum(-1, keepdim=True)
    probs = torch.softmax(logits, dim=-1)
    weights, experts = _choose(probs, k, bias)
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
    checkpointed_buffers = ("expert_bias",)  # engine/state.buffer_states

    def __init__(self, m, ctx, layer_number: int):
        super().__init__()
        self.k, self.kind = m.moe.top_k, m.moe.router
        # Under TP every rank routes other tokens (model/moe/layer.py): sum the gradient.
        self.state, self.tokens_split = ctx.state, ctx.state.tp > 1
        # [E, h], one seeded stream per line like every weight: the same in every layout.
        self.weight = nn.Parameter(sharded_normal(
            (m.moe.num_experts, m.hidden_size), m.init_method_std,
            seed_for(ctx.seed, f"layer{layer_number}.router")))
        self.bias_rate = m.moe.router_bias_update_rate
        if self.bias_rate:
            # [E] fp32, replicated; checkpointed beside the parameters (engine/state.py).
            self.register_buffer("expert_bias", torch.zeros(m.moe.num_experts))
            self.step_load = torch.zeros(m.moe.num_experts)  # this step's assignments per expert
        else:
            self.expert_bias = None

    def _apply(self, fn, *args, **kwargs):
        # .bfloat16() would round the bias, whose steps (the rate, ~1e-3) are below bf16's
        # resolution near its values: it stays fp32 wherever the model's weights go.
        super()._apply(fn, *args, **kwargs)
        if self.expert_bias is not None and self.expert_bias.dtype != torch.float32:
            self.expert_bias = self.expert_bias.float()
        return self

    def forward(self, x: torch.Tensor) -> Routing:  # x [T, h]
        # fp32 whatever the model's precision: the top-k choice and the losses are sensitive
        # to rounding of near-equal logits.
        w = replicated_param(self.weight, self.state, self.tokens_split)
        logits = F.linear(x.float(), w.float())  # [T, E]
        weights, experts, probs = top_k(logits, self.k, self.kind, self.expert_bias)
        if self.expert_bias is not None and self.training:
            self.step_load = self.step_load.to(logits.device) + torch.bincount(
                experts.reshape(-1), minlength=logits.shape[-1])
        return Routing(experts, weights, probs, logits)


@torch.no_grad()
def update_bias(routers, groups=(), skipped: bool = False) -> None:
    """After an optimizer step: each router's bias moves by its rate toward balance, b_e +=
    u x sign(mean load - load_e), the loads of the step's training forwards summed over every
    group of `groups` in turn (the ranks of a pipeline stage: data x context parallel, then
    tensor parallel, whose ranks route other tokens; one all_reduce per group for every
    router), so every rank keeps the same bias. Resets the counts; a skipped step (fp16
    overflow, the same on every rank) moves nothing."""
    routers = [r for r in routers if r.expert_bias is not None]
    if skipped:
        for r in routers:
            r.step_load = torch.zeros_like(r.step_load)
    if skipped or not routers:
        return
    loads = torch.stack([r.step_load.to(r.expert_bias.device).float() for r in routers])
    for group in groups:
        if group is not None and torch.distributed.get_world_size(group) > 1:
            torch.distributed.all_reduce(loads, group=group)
    for r, load in zip(routers, loads):
        r.expert_bias.add_(r.bias_rate * torch.sign(load.mean() - load))
        r.step_load = torch.zeros_like(r.step_load)
