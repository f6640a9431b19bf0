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
        # The sum accumulates in fp32 without an fp32 copy of dx (that copy was a third pass
        # over the activation, about a third of this backward's time on an H200).
        dbias = None if bias is None else (
            dx.reshape(-1, x.shape[-1]).sum(0, dtype=torch.float32).to(bias.dtype))
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


def native_activation(x, *others) -> bool:
    """Whether an activation that is not fused runs torch's own kernels in the inputs' dtype
    instead of the fp32 reference: on a GPU, where torch's GeLU and SiLU compute in fp32 inside
    and the reference's fp32 copies are only extra passes and larger saved tensors (the
    reference bias-GeLU of the 1.3B benchmark moves about 130 GB more a step, forward and
    backward; benchmarks/results/op_traffic_h200.md). The bias is added, and SwiGLU's product
    taken, in that dtype: one rounding more than the reference. The CPU keeps the reference
    (its runs are the equivalence and test runs), as do mixed dtypes."""
    return x.is_cuda and all(t is None or t.dtype == x.dtype for t in others)


def bias_gelu_unfused(x, bias):
    if native_activation(x, bias):
        return F.gelu(x if bias is None else x + bias, approximate="tanh")
    return bias_gelu_reference(x, bias)


def swiglu_unfused(gate, up):
    if native_activation(gate, up):
        return F.silu(gate) * up
    return swiglu_reference(gate, up)


BIAS_GELU = register("bias_gelu", bias_gelu_reference, bias_gelu_fused, bias_gelu_accepts,
                     bias_gelu_unfused)
SWIGLU = register("swiglu", swiglu_reference, swiglu_fused, swiglu_accepts, swiglu_unfused)
