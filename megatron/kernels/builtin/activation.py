"""The MLP activations: bias + tanh-GeLU and SwiGLU (csrc/bindings/activation.cpp, module
_fused_activation). References, autograd Functions, the calls each kernel accepts, and the two
records."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from megatron.kernels.fused import gpu_floats
from megatron.kernels.loader import load_module
from megatron.kernels.registry import register


def bias_gelu_reference(x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """Tanh-approximated GeLU, as GPT-2 and Megatron use."""
    y = x.float() if bias is None else x.float() + bias.float()
    return F.gelu(y, approximate="tanh").to(x.dtype)


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)


class _BiasGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias):
        ctx.save_for_backward(x, bias)
        return load_module("_fused_activation").bias_gelu_forward(x, bias).view(x.shape)

    @staticmethod
    def backward(ctx, grad):
        x, bias = ctx.saved_tensors
        dx = load_module("_fused_activation").bias_gelu_backward(grad, x, bias).view(x.shape)
        # d bias sums d(x + bias) over every leading dim; dx is rounded to x's dtype first,
        # which is within the tolerance Megatron's own fused bias-GeLU accepts.
        dbias = None if bias is None else dx.reshape(-1, x.shape[-1]).float().sum(0).to(bias.dtype)
        return dx, dbias


def bias_gelu_fused(x, bias):
    return _BiasGelu.apply(x, bias)


def bias_gelu_accepts(x, bias) -> bool:
    return (gpu_floats(x, bias) and x.dim() >= 1
            and (bias is None or (bias.dim() == 1 and bias.numel() == x.shape[-1])))


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return load_module("_fused_activation").swiglu_forward(gate, up).view(gate.shape)

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        dgate, dup = load_module("_fused_activation").swiglu_backward(grad, gate, up)
        return dgate.view(gate.shape), dup.view(up.shape)


def swiglu_fused(gate, up):
    return _SwiGLU.apply(gate, up)


def swiglu_accepts(gate, up) -> bool:
    return gpu_floats(gate, up) and gate.shape == up.shape and gate.dtype == up.dtype


BIAS_GELU = register("bias_gelu", bias_gelu_reference, bias_gelu_fused, bias_gelu_accepts)
SWIGLU = register("swiglu", swiglu_reference, swiglu_fused, swiglu_accepts)
