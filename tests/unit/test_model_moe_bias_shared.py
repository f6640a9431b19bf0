"""The MoE layer's auxiliary-loss-free balancing and its shared expert, in this process
(docs/moe.md). Failures localize to: the biased top-k choice or its unbiased weights
(router.top_k), the update rule (router.update_bias), the bias's dtype and checkpoint entry
(Router._apply, engine/state.buffer_states), the shared expert's place in the layer's output
and its seeding (layer.py), or the planner's and model_math's counts of it."""
from __future__ import annotations

import pytest
import torch

from megatron.config import ConfigError, load_config
from megatron.model.moe.router import top_k, update_bias
from tests.support.paths import TINY

MOE = ["model.moe.num_experts=4", "model.moe.top_k=2"]


def _model(extra, seed=None):
    from megatron.model import GPTModel, build_context
    from megatron.parallel.state import ParallelState
    cfg = load_config(TINY, MOE + extra + ([f"training.seed={seed}"] if seed else []))
    return cfg, GPTModel(cfg.model, build_context(cfg, ParallelState.single(), 512))


@pytest.mark.parametrize("router", ["softmax", "softmax_renorm", "sigmoid"])
def test_the_bias_changes_the_choice_and_not_the_weights(router):
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    w0, e0, p0 = top_k(logits, 2, router)
    bias = torch.tensor([-1.0, 0.0, 0.0, 1.0])  # expert 0 pushed out, expert 3 in
    w, e, p = top_k(logits, 2, router, bias)
    assert e0.tolist() == [[0, 1]] and e.tolist() == [[3, 1]]
    assert torch.equal(p, p0)  # the aux loss sees the unbiased probabilities
    scores = torch.sigmoid(logits) if router == "sigmoid" else torch.softmax(logits, -1)
    chosen = scores[0, [3, 1]]
    if router != "softmax":
        chosen = chosen / chosen.sum()
    torch.testing.assert_close(w[0], chosen, rtol=0, atol=0)
    # A zero bias chooses and weighs exactly as no bias.
    wz, ez, _ = top_k(logits, 2, router, torch.zeros(4))
    assert torch.equal(wz, w0) and torch.equal(ez, e0)


def _skewed_router(rate: float, router: str = "sigmoid"):
    """8 experts, top-2; tokens x = noise + v, the router's row 0 leaning 2 x along v: expert 0
    is the choice of most tokens (max/mean load about 3.3 of at most 4)."""
    from megatron.model import build_context
    from megatron.model.moe.router import Router
    from megatron.parallel.state import ParallelState
    cfg = load_config(TINY, ["model.moe.num_experts=8", "model.moe.top_k=2",
                             f"model.moe.router={router}",
                             f"model.moe.router_bias_update_rate={rate}"])
    r = Router(cfg.model, build_context(cfg, ParallelState.single(), 512), 0).train()
    torch.manual_seed(0)
    v = torch.randn(cfg.model.hidden_size)
    v = v / v.norm()
    with torch.no_grad():
        r.weight[0] += 2 * v
    return r, v


def _load_ratio(router, v, steps: int) -> list:
    """max/mean tokens per expert of each step (a forward of 256 tokens, then update_bias)."""
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        x = torch.randn(256, v.numel(), generator=gen) + v
        counts = torch.bincount(router(x).experts.reshape(-1), minlength=8).float()
        out.append(float(counts.max() / counts.mean()))
        update_bias([router])
    return out


@pytest.mark.parametrize("router,bound", [("sigmoid", 1.5), ("softmax", 2.3)])
def test_the_bias_update_balances_a_skewed_router(router, bound):
    # Seen: sigmoid 3.33 -> 1.31 (mean of the last 20 of 100 steps), softmax 3.33 -> 1.94: the
    # softmax's other experts share a small probability, so a bias step reorders them all
    # at once and the load swings (DeepSeek-V3 biases sigmoid scores).
    r, v = _skewed_router(0.01, router)
    ratios = _load_ratio(r, v, 100)
    assert ratios[0] > 3.0, ratios[:3]
    assert sum(ratios[-20:]) / 20 < bound, ratios[-20:]
    bias = r.expert_bias
    assert bias[0] < 0 and bias.dtype == torch.float32
    # every step moves each expert by the rate, or not at all at exactly the mean load
    steps = bias / 0.01
    torch.testing.assert_close(steps, steps.round(), rtol=0, atol=1e-3)
    off, _ = _skewed_router(0.0, router)
    assert off.expert_bias is None and min(_load_ratio(off, v, 5)) > 3.0


def test_a_skipped_step_moves_nothing_and_forgets_its_loads():
    router, v = _skewed_router(0.02)
    router(torch.randn(64, v.numel()) + v)
    update_bias([router], skipped=True)
    assert not router.expert_bias.any() and not router.step_load.any()
    router.eval()(torch.randn(64, v.numel()) + v)  # evaluation forwards are not counted
    assert not router.step_load.any()


def test_the_bias_stays_fp32_and_is_checkpointed_as_replicated_state():
    from megatron.engine.state import buffer_states
    from megatron.parallel.state import RankCoord
    _, model = _model(["model.moe.router_bias_update_rate=0.001", "model.moe.layer_freq=2"])
    model.bfloat16()
    biases = {n: b for n, b in model.named_buffers() if n.endswith("expert_bias")}
    assert sorted(biases) == ["layers.0.mlp.router.expert_bias", "layers.2.mlp.router.expert_bias"]
    assert all(b.dtype == torch.float32 for b in biases.values())
    states = buffer_states(model, RankCoord(tp=0, pp=0, dp_cp=0), [])
    assert [s.name for s in states] == sorted(biases)
    s = states[0]
    assert s.shape == (4,) and s.partition.dim is None and s.writes and s.experts is None
    biases[s.name].fill_(0.5)  # the fragment is a view: a load fills the buffer
    assert s.fragments[0].master.tolist() == [0.5] * 4
    assert not buffer_states(model, RankCoord(tp=0, pp=0, dp_cp=1), [])[0].writes
    assert not buffer_states(model, RankCoord(tp=1, pp=0, dp_cp=0), [])[0].writes  # TP replica
    assert buffer_states(_model([])[1], RankCoord(tp=0, pp=0, dp_cp=0), []) == []


def test_the_shared_expert_adds_a_dense_mlp_of_every_token_to_the_routed_output():
    _, plain = _model([])
    cfg, shared = _model(["model.moe.shared_expert_ffn_hidden_size=48"])
    layer, base = shared.moe_layers[0].eval(), plain.moe_layers[0].eval()
    fc1 = layer.shared_expert.fc1.weight
    assert tuple(fc1.shape) == (48, cfg.model.hidden_size)
    assert tuple(layer.shared_expert.fc2.weight.shape) == (cfg.model.hidden_size, 48)
    assert getattr(fc1, "expert_dim", None) is None  # replicated, not split over experts
    x = torch.randn(8, 2, cfg.model.hidden_size)
    with torch.no_grad():
        # The routed part is the model without a shared expert: the same seeds, the same output.
        torch.testing.assert_close(layer(x) - layer.shared_expert(x), base(x))
    # Its own seed streams: not the dense MLP's fc1 of a dense layer at the same position.
    _, dense = _model(["model.moe.layer_freq=2"])
    assert not torch.equal(dense.layers[1].mlp.fc1.weight[:48], fc1)
    _, again = _model(["model.moe.shared_expert_ffn_hidden_size=48"])
    assert torch.equal(again.moe_layers[0].shared_expert.fc1.weight, fc1)


def test_the_shared_expert_is_counted_by_the_planner_and_in_flops():
    from megatron.config.model_math import model_flops_per_token
    from megatron.planner.params import active_params, model_params
    cfg, model = _model(["model.moe.shared_expert_ffn_hidden_size=48"])
    base, _ = _model([])
    m, h = cfg.model, cfg.model.hidden_size
    per_layer = 48 * h + 48 + h * 48 + h  # fc1, its bias, fc2, its bias (GeLU)
    assert sum(p.numel() for p in model.parameters()) == model_params(m)
    assert model_params(m) == model_params(base.model) + m.num_layers * per_layer
    assert active_params(m) == active_params(base.model) + m.num_layers * per_layer
    extra = 3 * 2 * m.num_layers * 2 * h * 48  # fc1 + fc2 matmuls, 2 FLOPs a weight, x3
    assert model_flops_per_token(m, 512) == model_flops_per_token(base.model, 512) + extra


@pytest.mark.parametrize("field,value", [("router_bias_update_rate", -0.1),
                                         ("shared_expert_ffn_hidden_size", -4)])
def test_config_refuses_negative_values(field, value):
    with pytest.raises(ConfigError, match=f"model.moe.{field}"):
        load_config(TINY, MOE + [f"model.moe.{field}={value}"])


def test_zero_means_no_shared_expert():
    cfg, model = _model(["model.moe.shared_expert_ffn_hidden_size=0"])
    assert cfg.model.moe.shared_expert_ffn_hidden_size is None
    assert model.moe_layers[0].shared_expert is None
