"""Cross-entropy over logits whose vocabulary dimension is split across TP ranks, without ever
gathering the full [s, b, V] logits (which for a 50k vocabulary would dwarf the activations).

One collective per call: each rank reduces its slice to three numbers per token (its maximum
logit m_r, its sum of exp(z - m_r), and the target's logit, 0 where the target is another rank's)
and one all-gather of those [3, tokens] lets every rank combine them itself. (Megatron's form
all-reduces the maximum, the target logit and the sum of exponentials one after the other: three
latencies on a small message.)"""
from __future__ import annotations

import torch
import torch.distributed as dist


def _gather_stats(stats: torch.Tensor, group) -> torch.Tensor:
    """[k, n] on each rank -> [t, k, n] in rank order."""
    t = 1 if group is None else dist.get_world_size(group)
    if t == 1:
        return stats.unsqueeze(0)
    out = torch.empty((t * stats.shape[0],) + tuple(stats.shape[1:]), dtype=stats.dtype,
                      device=stats.device)
    dist.all_gather_into_tensor(out, stats.contiguous(), group=group)
    return out.view(t, *stats.shape)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Forward: per-token loss log(sum_v exp(z_v - M)) - (z_target - M) with M the maximum over
    the whole vocabulary; each rank's sum is rescaled from its own maximum to M.
    Backward: softmax - onehot(target), computed from this rank's slice only (no communication)."""

    @staticmethod
    def forward(ctx, logits, target, group, vocab_start):
        logits = logits.float()
        local_max = logits.max(dim=-1).values
        exp = (logits - local_max.unsqueeze(-1)).exp_()
        vocab_local = logits.shape[-1]
        outside = (target < vocab_start) | (target >= vocab_start + vocab_local)
        local_target = (target - vocab_start).masked_fill(outside, 0)
        target_logit = logits.gather(-1, local_target.unsqueeze(-1)).squeeze(-1)
        target_logit = target_logit.masked_fill(outside, 0.0)
        stats = torch.stack([local_max.reshape(-1), exp.sum(dim=-1).reshape(-1),
                             target_logit.reshape(-1)])
        stats = _gather_stats(stats, group)  # [t, 3, tokens]
        maxes, sums = stats[:, 0], stats[:, 1]
        global_max = maxes.max(dim=0).values
        if stats.shape[0] > 1:
            sums = sums * (maxes - global_max).exp()
        sum_exp = sums.sum(dim=0).view_as(local_max)
        global_max = global_max.view_as(local_max)
        loss = sum_exp.log() - (stats[:, 2].sum(dim=0).view_as(local_max) - global_max)
        if stats.shape[0] > 1:  # exp(z - m_r) -> exp(z - M)
            exp.mul_((local_max - global_max).exp_().unsqueeze(-1))
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
