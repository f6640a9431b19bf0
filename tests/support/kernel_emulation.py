"""Torch stand-ins for the compiled extension modules, with the kernels' own math (fp32, the
same forward/backward formulas as csrc/kernels/*.cuh). Installed into loader's module cache,
they let the CPU run the fused ops' autograd Functions (megatron/kernels/builtin/): the
plumbing (saved tensors, shapes, dtypes of weight grads) and the hand-written backward formulas
are checked against the references' autograd without a GPU."""
from __future__ import annotations

from types import SimpleNamespace

import torch


def _norm_forward(x, w, b, eps, rms):
    xf = x.float()
    mean = torch.zeros(xf.shape[:-1]) if rms else xf.mean(-1)
    rstd = torch.rsqrt((xf - mean[..., None]).pow(2).mean(-1) + eps)
    y = (xf - mean[..., None]) * rstd[..., None] * w.float()
    if b is not None:
        y = y + b.float()
    return y.to(x.dtype), (torch.empty(0) if rms else mean.reshape(-1)), rstd.reshape(-1)


def _norm_backward(dy, x, w, mean, rstd, rms, has_bias):
    n = w.numel()
    xf, g = x.float().reshape(-1, n), dy.float().reshape(-1, n)
    mu = torch.zeros(xf.shape[0]) if rms else mean
    xhat = (xf - mu[:, None]) * rstd[:, None]
    gdy = g * w.float()
    a = torch.zeros_like(rstd) if rms else gdy.mean(-1)
    bsum = (gdy * xhat).mean(-1)
    dx = rstd[:, None] * (gdy - a[:, None] - xhat * bsum[:, None])
    db = g.sum(0) if (has_bias and not rms) else None
    return dx.reshape(x.shape).to(x.dtype), (g * xhat).sum(0), db


def _masked_forward(scores, mask, scale):
    s = scores.float() * scale
    if mask is not None:
        s = s.masked_fill(mask, -10000.0)
    return torch.softmax(s, -1).to(scores.dtype)


def _softmax_backward(grad, probs, scale, masked):
    p, g = probs.float(), grad.float()
    dx = scale * p * (g - (g * p).sum(-1, keepdim=True))
    return dx.masked_fill(masked, 0.0).to(probs.dtype)


def _masked_backward(grad, probs, mask, scale):
    masked = torch.zeros_like(probs, dtype=torch.bool) if mask is None else mask.expand_as(probs)
    return _softmax_backward(grad, probs, scale, masked)


def _causal_mask(t):
    sq, sk = t.shape[-2:]
    return torch.ones(sq, sk, dtype=torch.bool).triu(1).expand_as(t)


def _causal_forward(scores, scale):
    s = (scores.float() * scale).masked_fill(_causal_mask(scores), float("-inf"))
    return torch.softmax(s, -1).to(scores.dtype)


def _causal_backward(grad, probs, scale):
    return _softmax_backward(grad, probs, scale, _causal_mask(probs))


def _rotary(x, cos, sin, backward):
    s, d = x.shape[0], x.shape[-1]
    shape = (s,) + (1,) * (x.dim() - 2) + (d,)
    c, sn = cos.float().reshape(shape), sin.float().reshape(shape)
    x1, x2 = x[..., : d // 2].float(), x[..., d // 2:].float()
    c1, c2, s1, s2 = c[..., : d // 2], c[..., d // 2:], sn[..., : d // 2], sn[..., d // 2:]
    if backward:
        y = torch.cat((x1 * c1 + x2 * s2, x2 * c2 - x1 * s1), -1)
    else:
        y = torch.cat((x1 * c1 - x2 * s1, x2 * c2 + x1 * s2), -1)
    return y.to(x.dtype)


K = 0.7978845608028654


def _gelu_input(x, bias):
    return x.float() + (0 if bias is None else bias.float())


def _gelu_forward(x, bias):
    v = _gelu_input(x, bias)
    return (0.5 * v * (1 + torch.tanh(K * (v + 0.044715 * v ** 3)))).to(x.dtype)


def _gelu_backward(grad, x, bias):
    v = _gelu_input(x, bias)
    t = torch.tanh(K * (v + 0.044715 * v ** 3))
    d = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * K * (1 + 3 * 0.044715 * v * v)
    return (grad.float() * d).to(x.dtype)


def _swiglu_backward(grad, gate, up):
    g, u, d = gate.float(), up.float(), grad.float()
    sg = torch.sigmoid(g)
    return (d * u * sg * (1 + g * (1 - sg))).to(gate.dtype), (d * g * sg).to(up.dtype)


MODULES = {
    "_fused_norm": SimpleNamespace(forward=_norm_forward, backward=_norm_backward),
    "_fused_softmax": SimpleNamespace(masked_forward=_masked_forward,
                                      masked_backward=_masked_backward,
                                      causal_forward=_causal_forward,
                                      causal_backward=_causal_backward),
    "_fused_rotary": SimpleNamespace(forward=lambda x, c, s: _rotary(x, c, s, False),
                                     backward=lambda g, c, s: _rotary(g, c, s, True)),
    "_fused_activation": SimpleNamespace(
        bias_gelu_forward=_gelu_forward, bias_gelu_backward=_gelu_backward,
        swiglu_forward=lambda g, u: (torch.nn.functional.silu(g.float()) * u.float()).to(g.dtype),
        swiglu_backward=_swiglu_backward),
}
