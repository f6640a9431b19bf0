"""The 1.3B benchmark's forward and backward as benchmarks/e2e/op_traffic.py reads them on the
meta device: the trainer's GPT runs the same matrix products as the plain PyTorch peer, and
moves at most a tenth more bytes (the fp32 loss; the q/k/v split's indexed backward once made
it a quarter more)."""
import importlib
import sys

import pytest

from tests.support.paths import ROOT


def _module(name: str):
    folder = f"{ROOT}/benchmarks/e2e"
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def traffic():
    op_traffic, shape = _module("op_traffic"), _module("bench_e2e").SHAPES["1.3b"]
    return {name: op_traffic.at_layers(step, shape.layers, shape) for name, step in (
        ("fused", lambda n, s: op_traffic.trainer_step(n, s, fused=True)),
        ("torch", op_traffic.trainer_step), ("peer", op_traffic.peer_step))}


def test_the_trainer_runs_the_peers_products(traffic):
    flops = {name: sum(t.flops.values()) for name, t in traffic.items()}
    assert flops["fused"] == flops["torch"] == pytest.approx(flops["peer"], rel=1e-9), flops
    assert flops["peer"] > 1e14  # 24 layers at 16K tokens: the products were seen at all


def test_the_trainer_moves_at_most_a_tenth_more_bytes_than_the_peer(traffic):
    total = {name: sum(t.bytes.values()) for name, t in traffic.items()}
    assert total["fused"] <= 1.10 * total["peer"], total
    assert total["torch"] <= 1.20 * total["peer"], total  # torch's own norms and activations
    calls = traffic["fused"].calls  # the q/k/v split's backward is one cat, not three fills
    assert calls["select_backward"] == 0 and calls["slice_backward"] <= 1, dict(calls)
