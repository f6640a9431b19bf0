"""The activations' torch path on a GPU (no fused build needed): torch's own GeLU and SiLU in
the inputs' dtype, taken when the inputs share it, against the fp32 reference at model-like
widths, forward and backward (the bias's gradient too)."""
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
