"""The ops' torch references (defined in megatron/kernels/builtin/, named through
megatron.kernels.reference) against independent float64 formulas on the CPU. A failure names
the op, dtype and case; the fused GPU kernels are held to these references by
tests/gpu/test_kernels_fused.py."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from megatron.kernels import reference

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}


def close(actual, expected, dtype, what):
    assert actual.dtype == dtype, f"{what}: dtype {actual.dtype}, expected {dtype}"
    torch.testing.assert_close(actual.double(), expected.double(), rtol=TOL[dtype],
                               atol=TOL[dtype], msg=lambda m: f"{what}: {m}")


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("wdtype", [None, torch.float32])
def test_layer_norm(dtype, wdtype):
    x = (torch.randn(3, 5, 67) * 3 + 2).to(dtype)
    w = torch.randn(67).to(wdtype or dtype)
    b = torch.randn(67).to(wdtype or dtype)
    xd = x.double()
    expect = (xd - xd.mean(-1, keepdim=True)) / torch.sqrt(xd.var(-1, unbiased=False, keepdim=True)
                                                          + 1e-5) * w.double() + b.double()
    close(reference.layer_norm(x, w, b, 1e-5), expect, dtype, f"layer_norm {dtype} w={wdtype}")
    no_bias = expect - b.double()
    close(reference.layer_norm(x, w, None, 1e-5), no_bias, dtype, "layer_norm without bias")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("wdtype", [None, torch.float32])
def test_rms_norm(dtype, wdtype):
    x = torch.randn(4, 129).to(dtype)
    w = torch.randn(129).to(wdtype or dtype)
    xd = x.double()
    expect = xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    close(reference.rms_norm(x, w, 1e-6), expect, dtype, f"rms_norm {dtype} w={wdtype}")


def test_norms_on_the_cpu_keep_the_exact_upcast_reference():
    """The dispatch's torch path on the CPU is the reference itself, bit for bit; torch's own
    kernels are used only on a GPU (tests/gpu/test_kernels_fused.py holds them to it there)."""
    from megatron.kernels import ops
    x = torch.randn(5, 2).to(torch.bfloat16)
    w, b = torch.ones(2, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.bfloat16)
    assert not ops.native_norm(x, w, b)
    assert torch.equal(ops.layer_norm(x, w, b, 1e-5), reference.layer_norm(x, w, b, 1e-5))
    assert torch.equal(ops.rms_norm(x, w, 1e-5), reference.rms_norm(x, w, 1e-5))


def test_activations_on_the_cpu_keep_the_exact_upcast_reference():
    """As the norms: on the CPU the torch path of bias-GeLU, SwiGLU and rotary is the fp32
    reference, bit for bit; torch's own kernels in the inputs' dtype run only on a GPU
    (tests/gpu/test_kernels_native_fallback.py holds them to it there)."""
    from megatron.kernels import ops
    x, b = torch.randn(5, 8).to(torch.bfloat16), torch.randn(8).to(torch.bfloat16)
    assert not ops.native_activation(x, b)
    assert torch.equal(ops.bias_gelu(x, b), reference.bias_gelu(x, b))
    assert torch.equal(ops.swiglu(x, x.flip(0)), reference.swiglu(x, x.flip(0)))
    from megatron.model.rotary import RotaryEmbedding
    cos, sin = RotaryEmbedding(8, 10000.0, 5).tables(5, x.device)
    q = x.view(5, 1, 1, 8)
    assert torch.equal(ops.rotary(q, cos, sin), reference.rotary(q, cos, sin))


def softmax64(s):
    e = torch.exp(s - s.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scaled_masked_softmax_broadcast_mask(dtype):
    scores = torch.randn(2, 3, 5, 37).to(dtype)
    mask = torch.rand(2, 1, 5, 37) < 0.3
    mask[0, 0, 1] = True  # a fully masked row comes out uniform, as in Megatron
    s = scores.double() * 0.125
    expect = softmax64(s.masked_fill(mask, -10000.0))
    got = reference.scaled_masked_softmax(scores, mask, 0.125)
    close(got, expect, dtype, f"masked softmax {dtype}")
    close(got[0, :, 1], torch.full((3, 37), 1 / 37, dtype=torch.float64), dtype, "masked row")


def test_scaled_masked_softmax_without_mask_and_grad_of_masked_is_zero():
    scores = torch.randn(1, 2, 4, 9, requires_grad=True)
    mask = torch.zeros(1, 1, 4, 9, dtype=torch.bool)
    mask[..., 5:] = True
    close(reference.scaled_masked_softmax(scores, None, 2.0), softmax64(scores.double() * 2.0),
          torch.float32, "unmasked softmax")
    reference.scaled_masked_softmax(scores, mask, 2.0).pow(2).sum().backward()
    assert torch.all(scores.grad[..., 5:] == 0), "masked scores must get no gradient"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sq", [1, 7, 33])
def test_scaled_causal_softmax(dtype, sq):
    scores = torch.randn(6, sq, sq).to(dtype)
    got = reference.scaled_causal_softmax(scores, 0.5)
    causal = torch.ones(sq, sq, dtype=torch.bool).triu(1)
    expect = softmax64((scores.double() * 0.5).masked_fill(causal, -math.inf))
    close(got, expect, dtype, f"causal softmax {dtype} sq={sq}")
    assert torch.all(got.masked_select(causal.expand_as(got)) == 0), "future positions leak"
    assert torch.all(got[:, 0, 0] == 1), "the first query sees only itself"


def rotary_tables(s, d, base=10000.0):
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.outer(torch.arange(s, dtype=torch.float64), inv)  # [s, d/2]
    return angles


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_is_a_complex_rotation(dtype):
    s, b, n, d = 11, 2, 3, 16
    angles = rotary_tables(s, d)
    emb = torch.cat((angles, angles), dim=-1)[:, None, None, :]  # halves repeated
    x = torch.randn(s, b, n, d).to(dtype)
    got = reference.rotary(x, emb.cos().float(), emb.sin().float())
    # Rotate-half pairs element j with j + d/2: (x1 + i x2) * exp(i angle).
    z = torch.complex(x[..., : d // 2].double(), x[..., d // 2:].double())
    z = z * torch.polar(torch.ones_like(angles), angles)[:, None, None, :]
    close(got, torch.cat((z.real, z.imag), dim=-1), dtype, f"rotary {dtype}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_bias_gelu_is_the_tanh_approximation(dtype, with_bias):
    x = (torch.randn(4, 7, 24) * 3).to(dtype)
    bias = torch.randn(24).to(dtype) if with_bias else None
    y = x.double() + (bias.double() if with_bias else 0)
    expect = 0.5 * y * (1 + torch.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))
    close(reference.bias_gelu(x, bias), expect, dtype, f"bias_gelu {dtype} bias={with_bias}")
    close(reference.bias_gelu(x, bias), F.gelu(y, approximate="tanh"), dtype, "torch gelu tanh")


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu(dtype):
    gate, up = torch.randn(5, 33).to(dtype), torch.randn(5, 33).to(dtype)
    g = gate.double()
    close(reference.swiglu(gate, up), g * torch.sigmoid(g) * up.double(), dtype, f"swiglu {dtype}")
