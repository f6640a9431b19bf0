"""A model variant from outside the package, registered in this file alone (config/variants.py):
a toy norm (ScaleNorm: x / rms(x) * one learned gain) and a toy attention core with weights of
its own (a learned temperature per query head, split over TP with the heads). Failures localize
to: the config's choices (sections.ModelConfig reads the registry), the model's builders
(model/norm.py, attention.py), the planner's count (planner/params.py), the checkpoint's refusal
of a tensor whose shape changed (checkpoint/sharded.py), the Hugging Face export's refusal
(checkpoint/hf_export.flavour), or TP2 training against DP2 (the same model unsharded).

Run by path under torchrun, this file is also the worker: it registers the same variants."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from megatron.config import ConfigError, InputError, load_config, variants
from megatron.config.variants import Variant, Weight
from megatron.parallel.layers import mark_tp, replicated_param

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))))
from tests.support.paths import TINY  # noqa: E402


class ScaleNorm(nn.Module):
    def __init__(self, m, ctx):
        super().__init__()
        self.state, self.sp = ctx.state, ctx.sequence_parallel
        self.gain = nn.Parameter(torch.full((1,), math.sqrt(m.hidden_size)))

    def forward(self, x):
        g = replicated_param(self.gain, self.state, self.sp)
        return x * torch.rsqrt(x.float().pow(2).sum(-1, keepdim=True) + 1e-6).to(x.dtype) * g


class TemperedCore(nn.Module):
    """softmax(q k^T * exp(t_head) / sqrt(d)) v; t starts at 0.1 x the head index. Its weight
    has the shape its record declares, this rank's heads of it."""

    def __init__(self, m, ctx, layer_number):
        super().__init__()
        state, shape = ctx.state, variants.get("attention", "tempered").weights[0].full(m)
        heads = 0.1 * torch.arange(shape[0], dtype=torch.float32)
        full = heads.view(-1, *[1] * (len(shape) - 1)).expand(shape)
        self.log_temperature = mark_tp(nn.Parameter(full.chunk(state.tp)[state.tp_rank].clone()),
                                       dim=0)

    def forward(self, q, k, v):
        s, b, n, d = q.shape
        q = q * self.log_temperature.exp().view(1, 1, n, 1).to(q.dtype)
        qt, kt, vt = (t.permute(1, 2, 0, 3) for t in (q, k, v))
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True,
                                             enable_gqa=n > k.shape[2])
        return out.permute(2, 0, 1, 3).reshape(s, b, n * d)


def _register(temperature_shape=lambda m: (m.num_attention_heads,)):
    variants.register(Variant("norm", "scalenorm", ScaleNorm,
                              weights=(Weight("gain", lambda m: (1,)),)), replace=True)
    variants.register(Variant("attention", "tempered", TemperedCore, keeps_scores=False,
                              weights=(Weight("log_temperature", temperature_shape, tp_dim=0),)),
                      replace=True)


@pytest.fixture(autouse=True, scope="module")
def toy_variants():
    """Registered for this module's tests only (a registration left behind would change what
    later modules see, tests/conftest.py)."""
    _register()
    yield
    variants.unregister("norm", "scalenorm")
    variants.unregister("attention", "tempered")


TOY = ["model.normalization=scalenorm", "model.attention_backend=tempered",
       "training.precision=fp32", "training.tensorboard=false", "training.global_batch_size=8",
       "training.micro_batch_size=2", "model.hidden_dropout=0.0", "model.attention_dropout=0.0",
       "training.train_iters=6"]


def test_the_config_takes_the_new_names_and_lists_them_when_refusing():
    cfg = load_config(TINY, TOY)
    assert (cfg.model.normalization, cfg.model.attention_backend) == ("scalenorm", "tempered")
    with pytest.raises(ConfigError, match="model.normalization") as e:
        load_config(TINY, ["model.normalization=nonorm"])
    assert "scalenorm" in str(e.value) and "rmsnorm" in str(e.value)


def test_the_planner_counts_the_declared_weights():
    from megatron.planner.params import layer_params, model_params
    cfg = load_config(TINY, TOY)
    base = load_config(TINY, ["model.normalization=rmsnorm", "model.attention_backend=sdpa"])
    heads = cfg.model.num_attention_heads
    # rmsnorm holds h weights per norm, scalenorm one; the core adds a temperature per head
    h = cfg.model.hidden_size
    assert layer_params(cfg.model, 2) == layer_params(base.model, 2) - 2 * (h - 1) + heads // 2
    assert model_params(cfg.model) == model_params(base.model) - (2 * cfg.model.num_layers + 1) \
        * (h - 1) + cfg.model.num_layers * heads


def test_hugging_face_export_refuses_the_variants_it_has_no_names_for():
    from megatron.checkpoint.hf_export import flavour
    with pytest.raises(InputError, match="maps to no Hugging Face architecture") as e:
        flavour(load_config(TINY, TOY).model)
    assert "model.normalization='scalenorm' declares no Llama names" in str(e.value)
    assert "model.attention_backend='tempered' declares no GPT-2 names" in str(e.value)


@pytest.mark.slow
def test_tp2_trains_the_toy_variants_as_dp2_does_and_refuses_a_changed_tensor(tmp_path):
    from tests.support.procs import launch_json
    got = launch_json(2, os.path.abspath(__file__), str(tmp_path / "out.json"),
                      "--workdir", str(tmp_path))
    dp2, tp2 = got["dp2"], got["tp2"]
    assert len(tp2) == 6 and tp2[-1] < tp2[0] - 0.05, tp2
    assert max(abs(a - b) for a, b in zip(dp2, tp2)) < 1e-5, (dp2, tp2)
    # every TP rank holds what the planner counts for it, core temperatures included
    assert got["model_params"] == [got["planner_params"]] * 2, got
    assert "layers.0.attention.core.log_temperature" in got["load_error"], got["load_error"]
    # resumed with a core that has no temperatures, the checkpoint's would be lost: refused
    assert "has no place for (layers.0.attention.core.log_temperature" in got["unused_error"]


def _worker(out: str, workdir: str) -> int:
    from megatron.config.model_math import padded_vocab_size
    from megatron.model import build_model
    from megatron.parallel.state import ParallelState
    from megatron.planner.params import stage_params
    from megatron.training.loop import train
    import torch.distributed as dist
    runs = {"dp2": [], "tp2": ["parallel.tensor_parallel_size=2"]}
    losses = {}
    for name, extra in runs.items():
        cfg = load_config(TINY, TOY + extra + [f"run.dir={workdir}/{name}", "training.save=true"])
        losses[name] = train(cfg).losses
    state = ParallelState.build(2, 1)
    model = build_model(cfg, state, padded_vocab_size(cfg.model.vocab_size, 128, 2))
    counts = [None, None]
    dist.all_gather_object(counts, sum(p.numel() for p in model.parameters()))
    planner = stage_params(cfg.model, 2, 1, 0).total
    # The core's weights change shape (2 per head): the saved tp2 checkpoint no longer fits.
    _register(lambda m: (m.num_attention_heads, 2))
    errors = {}
    for name, core in (("load_error", "tempered"), ("unused_error", "sdpa")):
        errors[name] = ""
        try:
            train(load_config(TINY, TOY + runs["tp2"] + [
                f"run.dir={workdir}/tp2", "training.load=auto", "training.train_iters=8",
                f"model.attention_backend={core}"]))
        except InputError as e:
            errors[name] = str(e)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(dict(losses, model_params=counts, planner_params=planner, **errors), f)
    return 0


if __name__ == "__main__":
    from tests.support.worker_exit import exit_after
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--workdir", required=True)
    args = p.parse_args()
    _register()
    exit_after(lambda: _worker(args.out, args.workdir))
