"""The norms' torch path on a GPU (no fused build needed): torch's own LayerNorm and RMSNorm
kernels, taken when the weights share the activations' dtype, against the exact upcast
reference at model-like row lengths, forward and backward."""
from __future__ import annotations

import pytest
import torch

from megatron.kernels import ops, reference

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")]

TOL = {torch.float16: 1e-2, torch.bfloat16: 5e-2}


def rel_err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-3)).item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("rows,n", [(257, 64), (64, 4096), (4, 12288)])
def test_native_norm_matches_reference(dtype, rms, rows, n):
    x = (torch.randn(rows, n, device="cuda") * 3 + 1).to(dtype)
    w = (torch.randn(n, device="cuda") + 1).to(dtype)
    b = None if rms else torch.randn(n, device="cuda").to(dtype)
    assert ops.native_norm(x, w, b)
    sel = ops.KernelSelection("torch", x.device)
    grad = torch.randn_like(x)
    results = []
    for fn in ((lambda x, w, b: ops.rms_norm(x, w, 1e-5, sel) if rms
                else ops.layer_norm(x, w, b, 1e-5, sel)),
               (lambda x, w, b: reference.rms_norm(x, w, 1e-5) if rms
                else reference.layer_norm(x, w, b, 1e-5))):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = fn(xs, ws, b)
        out.backward(grad)
        results.append((out, xs.grad, ws.grad))
    for name, got, want in zip(("forward", "grad input", "grad weight"), *results):
        assert got.dtype == want.dtype, name
        err = rel_err(got, want)
        assert err <= TOL[dtype], f"{'rms' if rms else 'layer'}_norm {dtype} [{rows}, {n}] {name}: {err:.2e}"
