"""The activations' and rotary's torch paths on a GPU (no fused build needed): torch's own GeLU
and SiLU, and the rotation, in the inputs' dtype, against the fp32 references at model-like
shapes, forward and backward (the bias's gradient too). The norms' are in
test_kernels_native_norm_fallback.py."""
from __future__ import annotations

import pytest
import torch

from megatron.kernels import ops, reference

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")]

# One rounding more than the reference (the bias sum, SwiGLU's product) in the inputs' dtype.
TOL = {torch.float16: 1e-2, torch.bfloat16: 5e-2}


def rel_err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-3)).item()


def _forward_backward(fn, inputs, grad):
    leaves = [t.clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward(grad)
    return [out] + [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows,n", [(257, 64), (64, 8192), (4, 49152)])
@pytest.mark.parametrize("op", ["bias_gelu", "swiglu"])
def test_native_activation_matches_reference(dtype, rows, n, op):
    x = (torch.randn(rows, n, device="cuda") * 2).to(dtype)
    other = torch.randn(n, device="cuda").to(dtype) if op == "bias_gelu" else \
        torch.randn(rows, n, device="cuda").to(dtype)
    assert ops.native_activation(x, other)
    sel = ops.KernelSelection("torch", x.device)
    grad = torch.randn_like(x)
    native = _forward_backward(lambda a, b: getattr(ops, op)(a, b, sel), (x, other), grad)
    exact = _forward_backward(getattr(reference, op), (x, other), grad)
    for name, got, want in zip(("forward", "grad input", "grad bias/up"), native, exact):
        assert got.dtype == want.dtype, name
        err = rel_err(got, want)
        assert err <= TOL[dtype], f"{op} {dtype} [{rows}, {n}] {name}: {err:.2e}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(257, 2, 4, 64), (2048, 2, 8, 128)])
def test_native_rotary_matches_reference(dtype, shape):
    from megatron.model.rotary import RotaryEmbedding
    cos, sin = RotaryEmbedding(shape[-1], 10000.0, shape[0]).tables(shape[0], torch.device("cuda"))
    x = torch.randn(*shape, device="cuda").to(dtype)
    sel = ops.KernelSelection("torch", x.device)
    grad = torch.randn_like(x)
    native = _forward_backward(lambda t: ops.rotary(t, cos, sin, sel), (x,), grad)
    exact = _forward_backward(lambda t: reference.rotary(t, cos, sin), (x,), grad)
    for name, got, want in zip(("forward", "grad input"), native, exact):
        assert got.dtype == want.dtype, name
        err = rel_err(got, want)
        assert err <= TOL[dtype], f"rotary {dtype} {shape} {name}: {err:.2e}"
