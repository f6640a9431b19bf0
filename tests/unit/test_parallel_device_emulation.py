"""MEGATRON_TEST_DEVICE_GFLOPS (base/faults.py), the benchmark hook that makes a CPU rank wait
as it would on an accelerator: every TP-layer GEMM sleeps its time at the given rate, in the pass
that computes it, with the products and gradients of the plain path unchanged."""
import pytest
import torch
import torch.nn.functional as F

from megatron.base import faults
from megatron.parallel import layers


@pytest.fixture
def emulated(monkeypatch):
    waits = []
    monkeypatch.setattr(layers, "_DEVICE_S_PER_FLOP", 1e-15)
    monkeypatch.setattr(layers, "_device_wait",
                        lambda x, w: waits.append(2 * x.numel() * w.shape[0]))
    return waits


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 8, generator=g, requires_grad=True)
    w = torch.randn(6, 8, generator=g, requires_grad=True)
    b = torch.randn(6, generator=g, requires_grad=True)
    return x, w, b


def test_the_products_and_gradients_are_the_plain_ones_and_each_pass_waits(emulated):
    x, w, b = _inputs()
    out = layers.linear(x, w, b)
    assert emulated == [2 * 15 * 8 * 6]  # the forward GEMM: 15 tokens, 8 -> 6
    out.square().sum().backward()
    assert len(emulated) == 3  # input gradient and weight gradient
    x2, w2, b2 = _inputs()
    F.linear(x2, w2, b2).square().sum().backward()
    torch.testing.assert_close(out, F.linear(x2, w2, b2))
    for got, want in ((x.grad, x2.grad), (w.grad, w2.grad), (b.grad, b2.grad)):
        torch.testing.assert_close(got, want)


def test_a_deferred_weight_gradient_waits_in_its_w_pass(emulated):
    """Under a zero-bubble schedule the weight GEMM's time belongs to W, not to B."""
    x, w, b = _inputs()
    store = layers.WeightGradStore()
    w.wgrad_store = store
    out = layers.linear(x, w, b)
    store.open()
    out.square().sum().backward()
    assert store.seal() == 0
    assert len(emulated) == 2 and w.grad is None  # forward and B
    store.run(0)
    assert len(emulated) == 3 and w.grad is not None


def test_without_grad_the_forward_still_waits(emulated):
    x, w, b = _inputs()
    with torch.no_grad():
        layers.linear(x, w, b)
    assert emulated == [2 * 15 * 8 * 6]


def test_the_rate_is_checked():
    assert faults.device_seconds_per_flop({}) is None
    assert faults.device_seconds_per_flop({faults.DEVICE_GFLOPS_VAR: "4"}) == 1 / 4e9
    with pytest.raises(ValueError, match="MEGATRON_TEST_DEVICE_GFLOPS='fast': expected a "
                                         "positive rate"):
        faults.device_seconds_per_flop({faults.DEVICE_GFLOPS_VAR: "fast"})
