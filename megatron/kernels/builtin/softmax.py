"""Scaled softmax of attention scores, with an arbitrary mask or the causal one
(csrc/bindings/softmax.cpp, module _fused_softmax). References, autograd Functions, the calls
each kernel accepts, and the two records."""
from __future__ import annotations

from typing import Optional

import torch

from megatron.kernels.fused import broadcasts, gpu_floats
from megatron.kernels.loader import load_module
from megatron.kernels.registry import register


def scaled_masked_softmax_reference(scores: torch.Tensor, mask: Optional[torch.Tensor],
                                    scale: float) -> torch.Tensor:
    """scores [b, np, sq, sk]; mask broadcastable, True where a position is masked out."""
    s = scores.float() * scale
    if mask is not None:
        s = s.masked_fill(mask, -10000.0)
    return torch.softmax(s, dim=-1).to(scores.dtype)


def scaled_causal_softmax_reference(scores: torch.Tensor, scale: float) -> torch.Tensor:
    """scores [b*np, sq, sk] with sq == sk; position j > i is masked."""
    sq, sk = scores.shape[-2:]
    causal = torch.ones(sq, sk, dtype=torch.bool, device=scores.device).triu_(1)
    s = (scores.float() * scale).masked_fill(causal, float("-inf"))
    return torch.softmax(s, dim=-1).to(scores.dtype)


class _MaskedSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, mask, scale):
        probs = load_module("_fused_softmax").masked_forward(scores, mask, scale)
        ctx.save_for_backward(probs, mask)
        ctx.scale = scale
        return probs

    @staticmethod
    def backward(ctx, grad):
        probs, mask = ctx.saved_tensors
        return load_module("_fused_softmax").masked_backward(grad, probs, mask, ctx.scale), \
            None, None


def scaled_masked_softmax_fused(scores, mask, scale):
    return _MaskedSoftmax.apply(scores, mask, float(scale))


def scaled_masked_softmax_accepts(scores, mask, scale) -> bool:
    return (gpu_floats(scores) and scores.dim() == 4
            and (mask is None or (mask.is_cuda and mask.dtype == torch.bool and mask.dim() <= 4
                                  and broadcasts(mask.shape, scores.shape))))


class _CausalSoftmax(torch.autograd.Function):
    """Scores [..., sq, sk] are viewed as [rows, sq, sk] for the kernel."""

    @staticmethod
    def forward(ctx, scores, scale):
        sq, sk = scores.shape[-2:]
        flat = scores.reshape(-1, sq, sk)
        probs = load_module("_fused_softmax").causal_forward(flat, scale)
        ctx.save_for_backward(probs)
        ctx.scale, ctx.shape = scale, scores.shape
        return probs.view(scores.shape)

    @staticmethod
    def backward(ctx, grad):
        (probs,) = ctx.saved_tensors
        g = grad.reshape(probs.shape)
        dx = load_module("_fused_softmax").causal_backward(g, probs, ctx.scale)
        return dx.view(ctx.shape), None


def scaled_causal_softmax_fused(scores, scale):
    return _CausalSoftmax.apply(scores, float(scale))


def scaled_causal_softmax_accepts(scores, scale) -> bool:
    return gpu_floats(scores) and scores.dim() >= 2


SCALED_MASKED_SOFTMAX = register("scaled_masked_softmax", scaled_masked_softmax_reference,
                                 scaled_masked_softmax_fused, scaled_masked_softmax_accepts)
SCALED_CAUSAL_SOFTMAX = register("scaled_causal_softmax", scaled_causal_softmax_reference,
                                 scaled_causal_softmax_fused, scaled_causal_softmax_accepts)
