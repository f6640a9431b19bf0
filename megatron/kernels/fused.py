"""Autograd Functions over the ahead-of-time fused kernels.

Each public function takes the same arguments as its reference in reference.py and returns the
same dtype and shape. `accepts(op, ...)` says whether a call fits the kernel's contract (GPU
tensors of fp32/fp16/bf16, the documented shapes); ops.py sends every other call to the
reference, so a fused selection never changes what a caller may pass.

Weight and bias gradients are summed in fp32 and cast to the parameter's dtype, as autograd
does for the reference."""
from __future__ import annotations

from typing import Optional

import torch

from megatron.kernels.loader import load_module

FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _gpu_floats(*tensors: Optional[torch.Tensor]) -> bool:
    return all(t is None or (t.is_cuda and t.dtype in FLOATS) for t in tensors)


def accepts(op: str, *args) -> bool:
    """Whether this call of `op` (args as in reference.py) fits the fused kernel."""
    if args and isinstance(args[0], torch.Tensor) and args[0].numel() == 0:
        return False  # nothing to launch; the reference returns the right empty tensor
    if op in ("layer_norm", "rms_norm"):
        x, weight, bias = args[0], args[1], (args[2] if op == "layer_norm" else None)
        return (_gpu_floats(x, weight, bias) and weight.dim() == 1 and x.dim() >= 1
                and x.shape[-1] == weight.numel()
                and (bias is None or bias.shape == weight.shape))
    if op == "scaled_masked_softmax":
        scores, mask = args[0], args[1]
        return (_gpu_floats(scores) and scores.dim() == 4
                and (mask is None or (mask.is_cuda and mask.dtype == torch.bool and mask.dim() <= 4
                                      and _broadcasts(mask.shape, scores.shape))))
    if op == "scaled_causal_softmax":
        return _gpu_floats(args[0]) and args[0].dim() >= 2
    if op == "rotary":
        x, cos, sin = args
        s, d = (x.shape[0], x.shape[-1]) if x.dim() >= 2 else (0, 1)
        return (_gpu_floats(x, cos, sin) and x.dim() >= 2 and d % 2 == 0
                and not (cos.requires_grad or sin.requires_grad)
                and all(t.shape[0] == s and t.shape[-1] == d and t.numel() == s * d
                        for t in (cos, sin)))
    if op == "bias_gelu":
        x, bias = args
        return (_gpu_floats(x, bias) and x.dim() >= 1
                and (bias is None or (bias.dim() == 1 and bias.numel() == x.shape[-1])))
    if op == "swiglu":
        gate, up = args
        return _gpu_floats(gate, up) and gate.shape == up.shape and gate.dtype == up.dtype
    raise KeyError(f"unknown fused op {op!r}")


def _broadcasts(small, big) -> bool:
    return all(a in (1, b) for a, b in zip(reversed(small), reversed(big)))


def _sum_to(grad32: torch.Tensor, like: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if like is None else grad32.to(like.dtype)


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


def layer_norm(x, weight, bias, eps):
    return _Norm.apply(x, weight, bias, float(eps), False)


def rms_norm(x, weight, eps):
    return _Norm.apply(x, weight, None, float(eps), True)


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


def scaled_masked_softmax(scores, mask, scale):
    return _MaskedSoftmax.apply(scores, mask, float(scale))


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


def scaled_causal_softmax(scores, scale):
    return _CausalSoftmax.apply(scores, float(scale))


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


def rotary(x, cos, sin):
    return _Rotary.apply(x, cos, sin)


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
        dbias = None if bias is None else _sum_to(dx.reshape(-1, x.shape[-1]).float().sum(0), bias)
        return dx, dbias


def bias_gelu(x, bias):
    return _BiasGelu.apply(x, bias)


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


def swiglu(gate, up):
    return _SwiGLU.apply(gate, up)
