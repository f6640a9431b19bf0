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
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
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


ROTARY = register("rotary", rotary_reference, rotary_fused, rotary_accepts)
