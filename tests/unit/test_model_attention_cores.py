"""The attention cores' dropout stream: with dropout they draw from the sharded ("tp") stream
and leave the default generator where it was; without it they touch neither (no state copies)."""
import pytest
import torch

from megatron.config import load_config
from megatron.model import build_model
from megatron.parallel.state import ParallelState
from tests.support.paths import ROOT


def _core(dropout: float):
    cfg = load_config(f"{ROOT}/examples/local/tiny.yaml", [
        "model.num_layers=1", "model.hidden_size=64", "model.num_attention_heads=4",
        "model.attention_backend=sdpa", f"model.attention_dropout={dropout}"])
    model = build_model(cfg, ParallelState.single(), 512)
    return model.layers[0].attention.core, model


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_the_sharded_stream_serves_dropout_only(dropout):
    core, model = _core(dropout)
    model.train()
    tracker = core.tracker
    q, k, v = (torch.randn(8, 2, 4, 16) for _ in range(3))
    default_before, tp_before = torch.get_rng_state(), tracker.states["tp"].clone()
    forks = []
    real_fork = tracker.fork
    tracker.fork = lambda name="tp": forks.append(name) or real_fork(name)
    out = core(q, k, v)
    assert out.shape == (8, 2, 64)
    assert torch.equal(torch.get_rng_state(), default_before)
    assert forks == (["tp"] if dropout else [])
    assert torch.equal(tracker.states["tp"], tp_before) == (dropout == 0.0)
    if dropout == 0.0:  # the same output as under the fork it no longer takes
        with real_fork("tp"):
            assert torch.equal(core(q, k, v), out)
