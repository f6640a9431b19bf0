"""Cross-entropy over logits whose vocabulary dimension is split across TP ranks, without ever
gathering the full [s, b, V] logits (which for a 50k vocabulary would dwarf the activations)."""
from __future__ import annotations

import torch
import torch.distributed as dist


def _all_reduce(x: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(x, op=op, group=group)
    return x


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Forward: per-token loss log(sum_v exp(z_v)) - z_target, with max and sum all-reduced.
    Backward: softmax - onehot(target), computed from this rank's slice only (no communication)."""

    @staticmethod
    def forward(ctx, logits, target, group, vocab_start):
        logits = logits.float()
        local_max = logits.max(dim=-1).values
        _all_reduce(local_max, group, dist.ReduceOp.MAX)
        shifted = logits - local_max.unsqueeze(-1)
        vocab_local = logits.shape[-1]
        outside = (target < vocab_start) | (target >= vocab_start + vocab_local)
        local_target = (target - vocab_start).masked_fill(outside, 0)
        target_logit = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1)
        target_logit = target_logit.masked_fill(outside, 0.0)
        _all_reduce(target_logit, group)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        _all_reduce(sum_exp, group)
        loss = sum_exp.log() - target_logit
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local_target, outside)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local_target, outside = ctx.saved_tensors
        grad = softmax
        onehot = torch.zeros_like(grad).scatter_(-1, local_target.unsqueeze(-1), 1.0)
        onehot.masked_fill_(outside.unsqueeze(-1), 0.0)
        grad.sub_(onehot).mul_(grad_loss.unsqueeze(-1))
        return grad, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, state) -> torch.Tensor:
    """logits [..., V/t] (this rank's slice), target [...] int64 -> per-token loss [...] fp32."""
    vocab_start = state.tp_rank * logits.shape[-1]
    return _VocabParallelCrossEntropy.apply(logits, target, state.tp_group, vocab_start)
