"""LayerNorm and RMSNorm: one kernel with an `rms` flag (csrc/bindings/norm.cpp, module
_fused_norm). Their references, the autograd Function, the calls the kernel accepts, the
torch path when the kernel is not taken, and the two records."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from megatron.kernels.fused import gpu_floats
from megatron.kernels.loader import load_module
from megatron.kernels.registry import register


def layer_norm_reference(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                         eps: float) -> torch.Tensor:
    y = F.layer_norm(x.float(), x.shape[-1:], weight.float(),
                     None if bias is None else bias.float(), eps)
    return y.to(x.dtype)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


class _Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, rms):
        y, mean, rstd = load_module("_fused_norm").forward(x, weight, bias, eps, rms)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.rms, ctx.has_bias = rms, bias is not None
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, grad):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = load_module("_fused_norm").backward(grad, x, weight, mean, rstd, ctx.rms,
                                                        ctx.has_bias)
        dbias = db.to(ctx.bias_dtype) if ctx.has_bias else None
        return dx.view(x.shape), dw.to(weight.dtype), dbias, None, None


def _fits(x, weight, bias=None) -> bool:
    return (gpu_floats(x, weight, bias) and weight.dim() == 1 and x.dim() >= 1
            and x.shape[-1] == weight.numel() and (bias is None or bias.shape == weight.shape))


def native_norm(x, *params) -> bool:
    """Whether a norm that is not fused goes to torch's own kernel instead of the reference.

    On a GPU, with weights in the activations' dtype (bf16/fp16 training keeps norm weights in
    the model dtype), torch's kernels keep fp32 statistics inside without materialising an fp32
    copy of the activations: the fast fallback when no fused build is present. On the CPU the
    reference's explicit upcast is kept: torch's CPU backward in bf16/fp16 loses precision on
    short rows, and CPU runs are the equivalence and test runs."""
    return x.is_cuda and all(p is None or p.dtype == x.dtype for p in params)


def layer_norm_fused(x, weight, bias, eps):
    return _Norm.apply(x, weight, bias, float(eps), False)


def layer_norm_accepts(x, weight, bias, eps) -> bool:
    return _fits(x, weight, bias)


def layer_norm_unfused(x, weight, bias, eps):
    if native_norm(x, weight, bias):
        return F.layer_norm(x, x.shape[-1:], weight, bias, eps)
    return layer_norm_reference(x, weight, bias, eps)


def rms_norm_fused(x, weight, eps):
    return _Norm.apply(x, weight, None, float(eps), True)


def rms_norm_accepts(x, weight, eps) -> bool:
    return _fits(x, weight)


def rms_norm_unfused(x, weight, eps):
    if native_norm(x, weight):
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    return rms_norm_reference(x, weight, eps)


LAYER_NORM = register("layer_norm", layer_norm_reference, layer_norm_fused, layer_norm_accepts,
                      layer_norm_unfused)
RMS_NORM = register("rms_norm", rms_norm_reference, rms_norm_fused, rms_norm_accepts,
                    rms_norm_unfused)
