"""Fused kernels against the torch references on a GPU: every dtype (and the mixed norm
pairs), non-power-of-two and long rows (including the streaming softmax path past 16384),
arbitrary, broadcast and fully masked rows, forward and backward. Errors are measured against
the largest reference magnitude, so a failure prints the op, case and the relative error."""
from __future__ import annotations

import pytest
import torch

from megatron.kernels import catalog, fused, loader, ops, reference

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Forward outputs are rounded to the dtype on both sides; gradients differ more because the
# kernels differentiate through the stored 16-bit output, as Megatron's fused kernels do.
FWD_TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
BWD_TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


@pytest.fixture(scope="module", autouse=True)
def built():
    if loader.load_build_info() is None:
        pytest.skip("no fused kernel build installed (pip install --no-build-isolation -e .)")
    dev = torch.device("cuda", torch.cuda.current_device())
    reasons = {op: loader.unavailable_reason(op, dev) for op in catalog.MODULE_OF}
    broken = {op: why for op, why in reasons.items() if why}
    assert not broken, f"the installed build cannot run here: {broken}"


def rel_err(a, b, floor=1e-3):
    # Floored (1e-3 by default) so that degenerate cases (one element) do not divide by ~0.
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(floor)).item()


def check(fn_fused, fn_ref, inputs, dtype, what, grad_inputs=None, grad_floor=1e-3):
    """Each gradient is held to the tolerance of the coarser of the op's dtype and its own (a
    bf16 weight's gradient is rounded to bf16 on both sides, whatever x's dtype); grad_floor is
    the smallest denominator of its relative error (rel_err), a number or a function of the
    upstream gradient (for a gradient that is a difference of larger terms: their size)."""
    grad_inputs = range(len(inputs)) if grad_inputs is None else grad_inputs
    a = [t.detach().clone().requires_grad_(i in grad_inputs) if t is not None else None
         for i, t in enumerate(inputs)]
    b = [t.detach().clone().requires_grad_(i in grad_inputs) if t is not None else None
         for i, t in enumerate(inputs)]
    out_f, out_r = fn_fused(*a), fn_ref(*b)
    assert out_f.dtype == out_r.dtype and out_f.shape == out_r.shape, what
    err = rel_err(out_f, out_r)
    assert err <= FWD_TOL[dtype], f"{what}: forward relative error {err:.2e}"
    grad = torch.randn_like(out_r)
    out_f.backward(grad)
    out_r.backward(grad)
    for i in grad_inputs:
        if a[i] is None:
            continue
        assert a[i].grad.dtype == b[i].grad.dtype, f"{what}: grad {i} dtype"
        floor = grad_floor(grad) if callable(grad_floor) else grad_floor
        err = rel_err(a[i].grad, b[i].grad, floor)
        tol = max(BWD_TOL[dtype], BWD_TOL[a[i].grad.dtype])
        assert err <= tol, f"{what}: grad of input {i} relative error {err:.2e}"


def rand(*shape, dtype, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


NORM_PAIRS = [(torch.float32, torch.float32), (torch.float16, torch.float16),
              (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32),
              (torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)]


def norm_terms(x, w, rms, eps):
    """The size of the terms a norm's input gradient is the difference of, r (w g - ...) with r
    the row's 1/sigma: the floor of its relative error. Where they cancel exactly (LayerNorm's
    rows of 2, whose x-hat is +-1 whatever x; RMSNorm's rows of 1) the gradient is ~0 and both
    sides hold only their rounding of these terms; elsewhere the gradient is about this size."""
    xf = x.float()
    centred = xf if rms else xf - xf.mean(-1, keepdim=True)
    r = (centred.pow(2).mean(-1, keepdim=True) + eps).rsqrt()

    def floor(grad):
        return max((r * (w.float() * grad.float()).abs()).max().item(), 1e-3)
    return floor


@pytest.mark.parametrize("dtype,wdtype", NORM_PAIRS)
# n = 1 is left out of LayerNorm: its output is beta and x-hat is 0, where the reference
# reads back its own rounding (~1e-5) as a weight gradient.
@pytest.mark.parametrize("rows,n", [(1, 2), (7, 2), (3, 7), (257, 1023), (64, 4096), (8, 12288),
                                    (4, 25600), (2048, 64)])
def test_layer_norm(dtype, wdtype, rows, n):
    x = rand(rows, n, dtype=dtype, scale=3.0) + 1.0
    w, b = rand(n, dtype=wdtype) + 1.0, rand(n, dtype=wdtype)
    check(lambda x, w, b: fused.layer_norm(x, w, b, 1e-5),
          lambda x, w, b: reference.layer_norm(x, w, b, 1e-5), (x, w, b), dtype,
          f"layer_norm {dtype}/{wdtype} [{rows}, {n}]",
          grad_floor=norm_terms(x, w, rms=False, eps=1e-5))


@pytest.mark.parametrize("dtype,wdtype", NORM_PAIRS)
@pytest.mark.parametrize("rows,n", [(1, 1), (9, 1), (5, 1023), (64, 4096), (4, 25600)])
def test_rms_norm(dtype, wdtype, rows, n):
    x, w = rand(2, rows, n, dtype=dtype), rand(n, dtype=wdtype) + 1.0
    # n = 1: the input's gradient, w g (1/r - x^2/r^3) = w g eps / r^3 (about 1e-6), is what is
    # left of two terms of size |w g| / r: its error is measured against their size.
    check(lambda x, w: fused.rms_norm(x, w, 1e-6), lambda x, w: reference.rms_norm(x, w, 1e-6),
          (x, w), dtype, f"rms_norm {dtype}/{wdtype} [{rows}, {n}]",
          grad_floor=norm_terms(x, w, rms=True, eps=1e-6))


# Row lengths cover each register width (1 value a thread up to 256, 4 up to 1024, 16 up to
# 8192) and its edges, non-powers of two, and the streaming path (> 8192).
SK = [1, 17, 100, 256, 257, 1000, 1025, 3000, 8192, 8193, 16384, 20000]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sk", SK)
@pytest.mark.parametrize("mask_kind", ["none", "random", "padding", "fully_masked_rows"])
def test_scaled_masked_softmax(dtype, sk, mask_kind):
    b, np_, sq = 2, 3, (4 if sk > 4096 else 9)
    scores = rand(b, np_, sq, sk, dtype=dtype, scale=4.0)
    mask = None
    if mask_kind == "random":
        mask = torch.rand(b, 1, sq, sk, device="cuda") < 0.3
    elif mask_kind == "padding":
        mask = torch.arange(sk, device="cuda")[None, None, None, :] >= max(1, sk * 2 // 3)
        mask = mask.expand(b, 1, 1, sk)
    elif mask_kind == "fully_masked_rows":
        mask = torch.zeros(1, 1, sq, sk, dtype=torch.bool, device="cuda")
        mask[..., 0, :] = True
    check(lambda s: fused.scaled_masked_softmax(s, mask, 0.125),
          lambda s: reference.scaled_masked_softmax(s, mask, 0.125), (scores,), dtype,
          f"masked softmax {dtype} sk={sk} mask={mask_kind}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("s", [1, 13, 128, 1000, 2048, 8193, 17000])
def test_scaled_causal_softmax(dtype, s):
    heads = 1 if s > 4096 else 4
    scores = rand(heads, s, s, dtype=dtype, scale=4.0)
    check(lambda x: fused.scaled_causal_softmax(x, 0.2),
          lambda x: reference.scaled_causal_softmax(x, 0.2), (scores,), dtype,
          f"causal softmax {dtype} s={s}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("s,d", [(1, 64), (7, 6), (2048, 128), (333, 80)])
def test_rotary(dtype, s, d):
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2, device="cuda").float() / d)
    emb = torch.outer(torch.arange(s, device="cuda").float(), inv).repeat(1, 2)[:, None, None]
    x = rand(s, 2, 3, d, dtype=dtype)
    check(lambda x: fused.rotary(x, emb.cos(), emb.sin()),
          lambda x: reference.rotary(x, emb.cos(), emb.sin()), (x,), dtype,
          f"rotary {dtype} s={s} d={d}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h", [1, 7, 4096, 5001])
@pytest.mark.parametrize("with_bias", [True, False])
def test_bias_gelu(dtype, h, with_bias):
    x = rand(33, 2, h, dtype=dtype, scale=2.0)
    bias = rand(h, dtype=dtype) if with_bias else None
    check(fused.bias_gelu, reference.bias_gelu, (x, bias), dtype,
          f"bias_gelu {dtype} h={h} bias={with_bias}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("numel", [1, 1001, 4096 * 64])
def test_swiglu(dtype, numel):
    gate, up = rand(numel, dtype=dtype, scale=3.0), rand(numel, dtype=dtype)
    check(fused.swiglu, reference.swiglu, (gate, up), dtype, f"swiglu {dtype} n={numel}")


def test_fused_mode_selects_every_op_and_dispatches_to_it():
    sel = ops.KernelSelection("fused", torch.device("cuda", torch.cuda.current_device()))
    assert all(sel.use_fused.values())
    x = rand(4, 64, dtype=torch.bfloat16)
    w = torch.ones(64, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6, sel), fused.rms_norm(x, w, 1e-6))


def test_noncontiguous_inputs():
    x = rand(64, 130, dtype=torch.bfloat16)[:, 1:129]  # a strided view, misaligned start
    w = torch.ones(128, device="cuda", dtype=torch.bfloat16)
    check(lambda x, w: fused.layer_norm(x, w, None, 1e-5),
          lambda x, w: reference.layer_norm(x, w, None, 1e-5), (x, w), torch.bfloat16,
          "layer_norm on a strided view")
