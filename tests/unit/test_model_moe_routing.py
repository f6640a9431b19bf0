"""The MoE layer's routing rules, in this process (docs/moe.md). Failures localize to: the drop
policy under a capacity (model/moe/dispatch.plan), the auxiliary losses (router.py), the sigmoid
router's normalisation, the grouped GEMM against the loop and the experts' weight gradients
deferred to a zero-bubble W pass (experts.py), the config's refusals
(config/moe.py, config/validate.py), or the planner's parameter count (planner/params.py)
against the model's."""
from __future__ import annotations

import math

import pytest
import torch

from megatron.config import ConfigError, load_config, validate_for_world
from megatron.model.moe.dispatch import combine, plan, select_rows
from megatron.model.moe.router import capacity, load_balancing_loss, top_k, z_loss
from tests.support.paths import TINY

MOE = ["model.moe.num_experts=4", "model.moe.top_k=2"]


def test_capacity_keeps_first_choices_in_token_order_then_second_choices():
    # 4 tokens, k=2, 3 experts; capacity ceil(4*2/3 * 0.75) = 2 assignments per expert.
    experts = torch.tensor([[0, 1], [0, 2], [1, 0], [0, 1]])
    weights = torch.full((4, 2), 0.5)
    cap = capacity(4, 2, 3, 0.75)
    assert cap == 2
    p = plan(experts, weights, 3, cap)
    # Expert 0 is the first choice of tokens 0, 1, 3 and the second of token 2: slot-major it
    # keeps tokens 0 and 1 (first choices in token order) and drops token 3's first choice and
    # token 2's second. Expert 1: first choice of token 2, second of 0 and 3 -> keeps 2, 0.
    # Expert 2: token 1's second choice -> kept.
    kept = {}
    starts = torch.cumsum(p.counts, 0) - p.counts
    for e in range(3):
        kept[e] = p.tokens[starts[e]:starts[e] + p.counts[e]].tolist()
    assert kept == {0: [0, 1], 1: [2, 0], 2: [1]}
    assert p.dropped == 3 and p.routed.tolist() == [4, 3, 1]


def test_dropless_keeps_every_assignment_and_combines_by_weight():
    experts = torch.tensor([[1, 0], [1, 0]])
    weights = torch.tensor([[0.75, 0.25], [0.5, 0.5]])
    p = plan(experts, weights, 2, None)
    assert p.dropped == 0 and p.counts.tolist() == [2, 2]
    rows = torch.tensor([[1.0], [2.0], [10.0], [20.0]])  # expert 0: tokens 0, 1; expert 1: 0, 1
    assert combine(rows, p, 2).flatten().tolist() == [0.25 * 1 + 0.75 * 10, 0.5 * 2 + 0.5 * 20]


def test_aux_loss_and_z_loss_against_a_hand_calculation():
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3]])
    experts = torch.tensor([[0, 1], [1, 2]])
    # f = (1, 2, 1) / 4, P = (0.4, 0.4, 0.2): 0.01 * 3 * (0.1 + 0.2 + 0.05)
    assert load_balancing_loss(probs, experts, 0.01).item() == pytest.approx(0.0105)
    logits = torch.tensor([[0.0, math.log(3.0)], [1.0, 1.0]])
    expected = 0.1 * (math.log(4.0) ** 2 + (1 + math.log(2.0)) ** 2) / 2
    assert z_loss(logits, 0.1).item() == pytest.approx(expected)


def test_sigmoid_router_normalises_the_chosen_weights():
    logits = torch.tensor([[2.0, -1.0, 0.5, 1.0]])
    weights, experts, probs = top_k(logits, 2, "sigmoid")
    assert experts.tolist() == [[0, 3]]
    s = torch.sigmoid(torch.tensor([2.0, 1.0]))
    assert torch.allclose(weights, (s / s.sum()).unsqueeze(0))
    assert probs.sum().item() == pytest.approx(1.0)
    weights, experts, probs = top_k(logits, 2, "softmax")
    assert torch.allclose(weights, torch.softmax(logits, -1)[:, [0, 3]])
    # Mixtral's: the same experts, weights a softmax over the two chosen logits.
    renorm, chosen, same = top_k(logits, 2, "softmax_renorm")
    assert chosen.tolist() == [[0, 3]] and torch.equal(same, probs)
    assert torch.allclose(renorm, torch.softmax(logits[:, [0, 3]], -1))


def _experts(extra=()):
    from megatron.model import build_context
    from megatron.model.moe.experts import Experts
    from megatron.parallel.state import ParallelState
    cfg = load_config(TINY, MOE + list(extra))
    return Experts(cfg.model, build_context(cfg, ParallelState.single(), 512), 0, 0, 4)


@pytest.mark.parametrize("flavour", [[], ["model.activation=swiglu",
                                          "model.add_bias_linear=false"]])
def test_grouped_gemm_forward_equals_the_loop(flavour):
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no torch._grouped_mm")
    experts = _experts(flavour)
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0, 0.05, generator=torch.Generator().manual_seed(p.numel()))
    x = torch.randn(20, 64, generator=torch.Generator().manual_seed(0))
    counts = [7, 0, 5, 8]  # an expert without tokens included
    experts.grouped = False
    loop = experts(x, counts)
    experts.grouped = True
    assert torch.allclose(experts(x, counts), loop, atol=1e-6, rtol=1e-5)


def test_repeated_rows_sum_their_gradients_in_a_fixed_order():
    """select_rows (the permute's tokens, the experts' biases per row): on two intra-op threads
    the backward gives the same bits every time. src[index] did not: its CPU backward,
    index_put_ with accumulate, adds with atomics from both threads (here 40 distinct results
    in 40, and a MoE run's loss moved in its last bits from run to run)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = torch.randn(4096, 32, generator=torch.Generator().manual_seed(0))
        index = torch.zeros(4096, dtype=torch.long)  # every row from one: the most contention
        src = torch.zeros(1, 32, requires_grad=True)
        assert torch.equal(select_rows(src.detach(), index), src.detach()[index])
        grads = set()
        for _ in range(20):
            src.grad = None
            select_rows(src, index).backward(g)
            grads.add(src.grad.numpy().tobytes())
    finally:
        torch.set_num_threads(threads)
    assert len(grads) == 1


@pytest.mark.parametrize("flavour", [[], ["model.activation=swiglu",
                                          "model.add_bias_linear=false"]])
def test_grouped_gemm_backward_equals_the_loop(flavour):
    """The CPU runs the grouped GEMM too (experts.py): its gradients are the loop's, also for a
    broadcast output gradient (sum().backward()), which its raw backward refuses."""
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no torch._grouped_mm")
    experts = _experts(flavour)
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0, 0.05, generator=torch.Generator().manual_seed(p.numel()))
    x = torch.randn(20, 64, generator=torch.Generator().manual_seed(0))
    g = torch.randn(20, 64, generator=torch.Generator().manual_seed(1))
    counts = [7, 0, 5, 8]
    grads = {}
    for grouped in (False, True):
        experts.grouped = grouped
        experts.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        experts(xi, counts).backward(g)
        grads[grouped] = [xi.grad] + [p.grad for p in experts.parameters()]
        experts(x, counts).sum().backward()  # a zero-stride gradient: must not raise
    for a, b in zip(grads[False], grads[True]):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)
    assert experts.grouped is True and experts(x[:0], [0, 0, 0, 0]).shape == (0, 64)


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("flavour", [[], ["model.activation=swiglu",
                                          "model.add_bias_linear=false"]])
def test_zero_bubble_defers_the_experts_weight_gradients(flavour, grouped, monkeypatch):
    """Under ZB-H1 and ZB-V (parallel/layers.defer_weight_grads) a B pass leaves the stacked
    expert weights' gradients in the store, an expert without rows included, and the W pass
    adds them: the input's and every parameter's gradient as without deferring, over two
    micro-batches accumulated (the loop and the grouped GEMM; grouped, bit for bit)."""
    from megatron.parallel.layers import WeightGradStore, defer_weight_grads
    if grouped and not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no torch._grouped_mm")
    experts = _experts(flavour)
    experts.grouped = grouped
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0, 0.05, generator=torch.Generator().manual_seed(p.numel()))
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(20, 64, generator=gen), torch.randn(20, 64, generator=gen), counts)
               for counts in ([7, 0, 5, 8], [1, 9, 0, 10])]

    def grads(store):
        experts.zero_grad(set_to_none=True)
        inputs = []
        for x, g, counts in batches:
            xi = x.clone().requires_grad_(True)
            if store is not None:
                store.open()
            experts(xi, counts).backward(g)
            if store is not None:
                store.seal()
            inputs.append(xi.grad)
        if store is not None:
            assert experts.w1.grad is None and experts.w2.grad is None  # B passes only
            assert store.pending() == 2
            real, calls = torch._grouped_mm, []
            monkeypatch.setattr(torch, "_grouped_mm",
                                lambda *a, **k: calls.append(1) or real(*a, **k), raising=False)
            for mb in range(2):
                store.run(mb)
            monkeypatch.undo()
            # grouped: each W pass one grouped GEMM a matrix (w1, w2), not one product an expert
            assert len(calls) == (4 if grouped else 0), calls
        return inputs + [p.grad for p in experts.parameters()]

    plain = grads(None)
    store = WeightGradStore()
    assert defer_weight_grads(experts, store) == 1
    deferred = grads(store)
    assert len(plain) == len(deferred) == 2 + len(list(experts.parameters()))
    for a, b in zip(plain, deferred):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5), (a - b).abs().max()
    if grouped:  # the W pass's one grouped GEMM a matrix is autograd's own product: same bits
        assert all(torch.equal(a, b) for a, b in zip(plain, deferred))


def test_experts_fall_back_to_the_loop_where_the_grouped_gemm_raises(monkeypatch, caplog):
    """A device or dtype whose grouped GEMM refuses the layer (CUDA's has been bf16-only in some
    torch releases) runs the loop: same output, one warning naming the dtype and the reason, and
    the trial is not repeated on later calls."""
    from megatron.model.moe import experts as experts_module
    experts = _experts()
    x = torch.randn(20, 64, generator=torch.Generator().manual_seed(0))
    counts = [7, 0, 5, 8]
    experts.grouped = False
    loop = experts(x, counts)
    experts.grouped = None
    calls = []

    def refuses(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("Expected inputs of BF16 type but got mat_a.dtype=float")

    monkeypatch.setattr(experts_module, "_GROUPED_PROBES", {})
    monkeypatch.setattr(torch, "_grouped_mm", refuses)
    with caplog.at_level("WARNING", logger=experts_module.__name__):
        assert torch.equal(experts(x, counts), loop)
        assert torch.equal(experts(x, counts), loop)
    assert len(calls) == 1, "the grouped GEMM was tried again after it refused"
    warned = [r.getMessage() for r in caplog.records if "grouped GEMM" in r.getMessage()]
    assert len(warned) == 1 and "float32" in warned[0] and "BF16 type" in warned[0], warned
    why = experts_module.grouped_gemm_works(x.device, x.dtype, 64, *experts.w1.shape[1:2],
                                            experts.w2.shape[2])
    assert why and why.startswith("RuntimeError")


def test_experts_take_the_grouped_gemm_where_it_runs(monkeypatch):
    """Where the trial passes, the default (grouped = None) is the grouped GEMM: the loop is not
    called."""
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no torch._grouped_mm")
    from megatron.model.moe import experts as experts_module
    monkeypatch.setattr(experts_module, "_GROUPED_PROBES", {})
    experts = _experts()
    monkeypatch.setattr(experts, "_loop", lambda *a: pytest.fail("the loop ran"))
    x = torch.randn(20, 64, generator=torch.Generator().manual_seed(0))
    assert experts(x, [7, 0, 5, 8]).shape == (20, 64)
    assert list(experts_module._GROUPED_PROBES.values()) == [None]


@pytest.mark.parametrize("overrides, world, field", [
    (["model.moe.num_experts=-1"], 1, "model.moe.num_experts"),
    (MOE[:1] + ["model.moe.top_k=5"], 1, "model.moe.top_k"),
    (MOE + ["model.moe.layer_freq=0"], 1, "model.moe.layer_freq"),
    (MOE + ["model.moe.capacity_factor=0"], 1, "model.moe.capacity_factor"),
    (MOE + ["model.moe.router=relu"], 1, "model.moe.router"),
    (MOE + ["model.moe.aux_loss_coeff=-1"], 1, "model.moe.aux_loss_coeff"),
    (MOE + ["model.moe.ffn_hidden_size=0"], 1, "model.moe.ffn_hidden_size"),
    (["parallel.expert_parallel_size=0"], 1, "parallel.expert_parallel_size"),
    (["parallel.expert_parallel_size=2"], 2, "parallel.expert_parallel_size"),
    (MOE + ["parallel.expert_parallel_size=3"], 3, "parallel.expert_parallel_size"),
    (MOE + ["parallel.expert_parallel_size=4"], 2, "parallel.expert_parallel_size"),
    # a stage of tp2 x dp1 ranks cannot hold experts split four ways
    (MOE + ["parallel.expert_parallel_size=4", "parallel.tensor_parallel_size=2"], 2,
     "parallel.expert_parallel_size"),
    (MOE + ["parallel.expert_parallel_size=2", "parallel.zero_stage=3"], 2,
     "parallel.zero_stage"),
    (MOE + ["parallel.tensor_parallel_size=2", "parallel.zero_stage=3"], 2,
     "parallel.zero_stage"),

    (MOE + ["parallel.expert_parallel_size=2", "parallel.zero_stage=0", "training.precision=bf16"],
     2, "parallel.zero_stage"),
    (MOE + ["parallel.tensor_parallel_size=2", "parallel.zero_stage=0", "training.precision=bf16"],
     2, "parallel.zero_stage"),
    # without sequence parallelism each TP rank routes 1/t of the sequence
    (MOE + ["parallel.tensor_parallel_size=2", "model.seq_length=65"], 2, "model.seq_length"),
    # experts split over ranks and a pipeline stage without a MoE layer: its optimizer holds no
    # expert group where the other stage does, and DeepSpeed's ZeRO norm hung (measured)
    (MOE + ["model.moe.layer_freq=4", "parallel.pipeline_parallel_size=2",
            "parallel.expert_parallel_size=2"], 4, "model.moe.layer_freq"),
    (MOE + ["parallel.pipeline_parallel_size=2", "parallel.tensor_parallel_size=2",
            "parallel.pipeline_loss_as_layer=true", "model.num_layers=1"], 4,
     "model.moe.layer_freq"),  # a last stage of the head alone
    (MOE + ["model.moe.layer_freq=2", "parallel.pipeline_parallel_size=2",
            "parallel.expert_parallel_size=2", "parallel.pipeline_partition_method=parameters"],
     4, "parallel.pipeline_partition_method"),
    # interleaved 1F1B's loop gives rank 1 model chunks 1 and 3 (layers 1 and 3): no MoE layer
    (MOE + ["parallel.pipeline_parallel_size=2", "parallel.expert_parallel_size=2",
            "parallel.virtual_pipeline_size=2", "parallel.pipeline_schedule=interleaved",
            "model.moe.layer_freq=2"], 4, "model.moe.layer_freq"),
])
def test_config_refusals_name_their_fields(overrides, world, field):
    """Every layout experts cannot run is one message naming the field."""
    with pytest.raises(ConfigError) as e:
        validate_for_world(load_config(TINY, overrides), world)
    assert e.value.field == field and str(e.value).startswith(field), str(e.value)


@pytest.mark.parametrize("schedule, chunks, held", [("1f1b", 1, "layers 2-3"),
                                                    ("interleaved", 2, "layers 1, 3")])
def test_a_stage_without_a_moe_layer_is_named_with_the_layers_it_holds(schedule, chunks, held):
    """4 layers on 2 stages with EP 2: under 1F1B at layer_freq 4 (MoE in layer 0) stage 1
    holds layers 2-3, under the interleaved loop at layer_freq 2 (layers 0 and 2) layers 1 and
    3, neither MoE."""
    freq = 4 if chunks == 1 else 2
    with pytest.raises(ConfigError) as e:
        validate_for_world(load_config(TINY, MOE + [
            f"model.moe.layer_freq={freq}", "parallel.pipeline_parallel_size=2",
            "parallel.expert_parallel_size=2", f"parallel.virtual_pipeline_size={chunks}",
            f"parallel.pipeline_schedule={schedule}"]), 4)
    assert f"stage 1 holds {held}, none of them MoE" in str(e.value), str(e.value)


@pytest.mark.parametrize("overrides, world", [
    (["parallel.tensor_parallel_size=2", "parallel.sequence_parallel=true",
      "parallel.expert_parallel_size=2"], 2),
    (["parallel.tensor_parallel_size=2", "parallel.expert_parallel_size=4"], 4),
    (["parallel.context_parallel_size=2", "parallel.expert_parallel_size=2"], 2),
    (["parallel.pipeline_parallel_size=2", "parallel.expert_parallel_size=2"], 4),
    (["parallel.pipeline_parallel_size=2", "parallel.pipeline_schedule=zbh1",
      "parallel.expert_parallel_size=2"], 4),
    (["training.activation_checkpointing=full", "parallel.expert_parallel_size=2"], 2),
    # EP 1, TP 1: ZeRO-3 partitions the experts as any parameter
    (["parallel.zero_stage=3"], 2),
    # model chunks: ZB-V's V gives rank 0 layers 0 and 3, rank 1 layers 1 and 2 (one MoE layer
    # each at layer_freq 2); interleaved 1F1B's loop with MoE in every layer
    (["parallel.pipeline_parallel_size=2", "parallel.expert_parallel_size=2",
      "parallel.virtual_pipeline_size=2", "parallel.pipeline_schedule=zbv",
      "model.moe.layer_freq=2"], 4),
    (["parallel.pipeline_parallel_size=2", "parallel.expert_parallel_size=2",
      "parallel.virtual_pipeline_size=2", "parallel.pipeline_schedule=interleaved"], 4),
])
def test_experts_compose_with_the_other_axes(overrides, world):
    """What earlier slices refused: EP with TP (SP or not), CP, PP (1F1B, ZB-H1, and the model
    chunks of interleaved 1F1B and ZB-V) and full recomputation (the routers' losses ride on
    the layer's output)."""
    validate_for_world(load_config(TINY, MOE + overrides), world)


@pytest.mark.parametrize("extra", [[], ["model.activation=swiglu", "model.add_bias_linear=false",
                                        "model.moe.layer_freq=3", "model.moe.ffn_hidden_size=96",
                                        "model.tie_embeddings=false"],
                                   ["model.activation=swiglu",
                                    "model.moe.shared_expert_ffn_hidden_size=48"]])
@pytest.mark.parametrize("ep", [1, 2, 4])
def test_the_planner_counts_what_each_expert_parallel_rank_holds(extra, ep):
    from megatron.model import GPTModel, build_context
    from megatron.parallel.experts import ExpertParallel, expert_grid
    from megatron.parallel.state import ParallelState
    from megatron.planner.params import active_params, model_params, stage_params
    cfg = load_config(TINY, MOE + extra)
    state = ParallelState.single()
    # rank 1 of a world of `ep` data-parallel ranks, without process groups (nothing runs)
    grid_state = ParallelState(dp=ep, rank=min(1, ep - 1))
    ctx = build_context(cfg, state, 512)
    ctx.expert = ExpertParallel(expert_grid(grid_state, ep), grid_state.rank)
    held = sum(p.numel() for p in GPTModel(cfg.model, ctx).parameters())
    assert held == stage_params(cfg.model, 1, 1, 0, ep=ep).total
    if ep == 1:
        assert held == model_params(cfg.model)
    assert active_params(cfg.model) < model_params(cfg.model)


def test_a_dense_model_has_no_expert_parameters_and_the_same_flops():
    from megatron.config.model_math import model_flops_per_token
    from megatron.model import build_model
    from megatron.parallel.state import ParallelState
    cfg = load_config(TINY, [])
    names = [n for n, _ in build_model(cfg, ParallelState.single(), 512).named_parameters()]
    assert not [n for n in names if "router" in n or "experts" in n]
    moe = load_config(TINY, MOE + ["model.moe.layer_freq=2"])
    # top-2 of 4 experts as wide as the dense MLP: each of the 2 MoE layers (0 and 2) costs one
    # more MLP and the router, 2 FLOPs a weight forward, x3 with the backward
    m, h = cfg.model, cfg.model.hidden_size
    extra = 3 * 2 * 2 * (2 * h * m.ffn_hidden_size + 4 * h)
    assert model_flops_per_token(moe.model, 512) == model_flops_per_token(m, 512) + extra
