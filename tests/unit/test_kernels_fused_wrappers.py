"""The fused ops' autograd Functions (megatron/kernels/builtin/) and ops.dispatch, on the CPU,
with the extension modules replaced by torch emulations of the kernels
(tests/support/kernel_emulation.py). Forward
outputs and every input/weight/bias gradient must match the reference's autograd; a failure
points at the Python wrapper or at a backward formula that the CUDA/HIP kernels share."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from megatron.kernels import fused, loader, ops, reference, registry

from tests.support.kernel_emulation import MODULES

TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}


@pytest.fixture(autouse=True)
def emulated(monkeypatch):
    monkeypatch.setattr(loader, "_MODULE_CACHE", dict(MODULES))
    torch.manual_seed(0)


def leaves(*tensors):
    return [None if t is None else t.detach().clone().requires_grad_(True) for t in tensors]


def compare(fn_fused, fn_ref, inputs, dtype, what):
    a, b = leaves(*inputs), leaves(*inputs)
    out_f, out_r = fn_fused(*a), fn_ref(*b)
    assert out_f.dtype == out_r.dtype and out_f.shape == out_r.shape, what
    grad = torch.randn_like(out_r.float()).to(out_r.dtype)
    out_f.backward(grad)
    out_r.backward(grad)
    tol = TOL[dtype]
    torch.testing.assert_close(out_f.float(), out_r.float(), rtol=tol, atol=tol,
                               msg=lambda m: f"{what} forward: {m}")
    for i, (x, y) in enumerate(zip(a, b)):
        if x is None:
            continue
        assert x.grad is not None and x.grad.dtype == y.grad.dtype, f"{what} grad {i} dtype"
        torch.testing.assert_close(x.grad.float(), y.grad.float(), rtol=tol, atol=tol * 4,
                                   msg=lambda m: f"{what} grad of input {i}: {m}")


@pytest.mark.parametrize("dtype,wdtype", [(torch.float32, torch.float32),
                                          (torch.bfloat16, torch.bfloat16),
                                          (torch.bfloat16, torch.float32),
                                          (torch.float16, torch.float32)])
@pytest.mark.parametrize("rms", [False, True])
def test_norms(dtype, wdtype, rms):
    x = torch.randn(3, 4, 40).to(dtype)
    w, b = (1 + 0.1 * torch.randn(40)).to(wdtype), torch.randn(40).to(wdtype)
    if rms:
        compare(lambda x, w: fused.rms_norm(x, w, 1e-6), lambda x, w: reference.rms_norm(x, w, 1e-6),
                (x, w), dtype, f"rms_norm {dtype}/{wdtype}")
    else:
        compare(lambda x, w, b: fused.layer_norm(x, w, b, 1e-5),
                lambda x, w, b: reference.layer_norm(x, w, b, 1e-5), (x, w, b), dtype,
                f"layer_norm {dtype}/{wdtype}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masked_softmax_with_fully_masked_row(dtype):
    scores = torch.randn(2, 2, 5, 19).to(dtype)
    mask = torch.rand(2, 1, 5, 19) < 0.4
    mask[1, 0, 3] = True
    compare(lambda s: fused.scaled_masked_softmax(s, mask, 0.3),
            lambda s: reference.scaled_masked_softmax(s, mask, 0.3), (scores,), dtype,
            f"masked softmax {dtype}")


@pytest.mark.parametrize("shape", [(6, 9, 9), (2, 3, 9, 9)])
def test_causal_softmax_any_leading_dims(shape):
    compare(lambda s: fused.scaled_causal_softmax(s, 0.7),
            lambda s: reference.scaled_causal_softmax(s, 0.7), (torch.randn(*shape),),
            torch.float32, f"causal softmax {shape}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary(dtype):
    s, d = 7, 12
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d)
    emb = torch.outer(torch.arange(s).float(), inv).repeat(1, 2)[:, None, None, :]
    x = torch.randn(s, 2, 3, d).to(dtype)
    compare(lambda x: fused.rotary(x, emb.cos(), emb.sin()),
            lambda x: reference.rotary(x, emb.cos(), emb.sin()), (x,), dtype, f"rotary {dtype}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [True, False])
def test_bias_gelu(dtype, with_bias):
    x = (torch.randn(3, 5, 16) * 2).to(dtype)
    bias = torch.randn(16).to(dtype) if with_bias else None
    compare(fused.bias_gelu, reference.bias_gelu, (x, bias), dtype, f"bias_gelu {dtype}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu(dtype):
    compare(fused.swiglu, reference.swiglu, (torch.randn(4, 30).to(dtype),
                                             torch.randn(4, 30).to(dtype)), dtype, "swiglu")


def test_dispatch_sends_cpu_tensors_to_the_reference_even_when_fused_is_selected():
    sel = ops.KernelSelection("torch")
    sel.use_fused = {op: True for op in registry.names()}
    loader._MODULE_CACHE.clear()  # a call into fused would now fail loudly
    x, w = torch.randn(2, 8), torch.ones(8)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6, sel), reference.rms_norm(x, w, 1e-6))
    assert not fused.accepts("swiglu", x, x), "CPU tensors are outside the kernel contract"


def test_dispatch_uses_the_fused_path_when_selected_and_accepted(monkeypatch):
    calls = []
    record = dataclasses.replace(registry.get("swiglu"), accepts=lambda g, u: True,
                                 fused=lambda g, u: calls.append("fused") or g)
    monkeypatch.setitem(registry._RECORDS, "swiglu", record)
    sel = ops.KernelSelection("torch")
    sel.use_fused["swiglu"] = True
    ops.swiglu(torch.ones(2), torch.ones(2), sel)
    assert calls == ["fused"]
    sel.use_fused["swiglu"] = False
    out = ops.swiglu(torch.ones(2), torch.ones(2), sel)
    assert calls == ["fused"] and math.isclose(out[0].item(), torch.nn.functional.silu(
        torch.tensor(1.0)).item(), rel_tol=1e-6)
