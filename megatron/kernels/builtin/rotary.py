"""Rotary position embedding, rotate-half convention (GPT-NeoX/LLaMA; csrc/bindings/rotary.cpp,
module _fused_rotary). The reference, the autograd Function, the calls the kernel accepts, and
the record."""
from __future__ import annotations

import torch

from megatron.kernels.fused import gpu_floats
from megatron.kernels.loader import load_module
from megatron.kernels.registry import register


def rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [s, b, n, d]; cos/sin [s, 1, 1, d] (halves repeated). Rotate-half convention."""
    x1, x2 = x.chunk(2, dim=-1)  # a split: its backward is one cat, not two zero-filled copies
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class _Rotary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return load_module("_fused_rotary").forward(x, cos, sin).view(x.shape)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        dx = load_module("_fused_rotary").backward(grad, cos, sin)
        return dx.view(grad.shape), None, None


def rotary_fused(x, cos, sin):
    return _Rotary.apply(x, cos, sin)


def rotary_accepts(x, cos, sin) -> bool:
    # The kernel gives no gradient to cos/sin, and reads one [s, d] table of each.
    s, d = (x.shape[0], x.shape[-1]) if x.dim() >= 2 else (0, 1)
    return (gpu_floats(x, cos, sin) and x.dim() >= 2 and d % 2 == 0
            and not (cos.requires_grad or sin.requires_grad)
            and all(t.shape[0] == s and t.shape[-1] == d and t.numel() == s * d
                    for t in (cos, sin)))


def rotary_unfused(x, cos, sin):
    """On a GPU, the rotation in x's dtype (the tables cast to it, as Megatron's unfused path
    does), where the reference's fp32 copies of x and of its rotated half cost passes over every
    query and key: at the 1.3B benchmark's shape with rotary positions, 65 GB a step forward and
    backward against the reference's 158 (benchmarks/e2e/op_traffic.py's recorder on the meta
    device). Elsewhere the reference."""
    if not x.is_cuda or x.dtype == torch.float32:
        return rotary_reference(x, cos, sin)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat((-x2, x1), dim=-1) * sin.to(x.dtype)


ROTARY = register("rotary", rotary_reference, rotary_fused, rotary_accepts, rotary_unfused)
