"""Mixture of experts with expert parallelism against one rank (docs/moe.md). Failures localize
to: the token exchange and the expert layer (the layer check: outputs and the experts' and
router's gradients of one MoE layer at EP2 against the same layer on one rank, with the same
weights, dropless and with a capacity), or a layout's composition (10 training steps, fp32, no
dropout, clipping on, against one rank: losses, gradient norms and the logged auxiliary
losses): EP under ZeRO-0, 1 and 2 (and ZeRO-3 at EP 1), over data, tensor (with and without
SP), context and pipeline parallel ranks (1F1B, ZB-H1, and two model chunks a rank:
interleaved 1F1B and ZB-V), and with full recomputation.

Run by path under torchrun, this file is also the worker: it trains the layouts it is given
in one launch (DeepSpeed's start-up is the slow part) and writes rank 0's results."""
from __future__ import annotations

import argparse
import json
import os
import sys

import pytest

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))))
from tests.support.moe import MOE  # noqa: E402
from tests.support.paths import TINY  # noqa: E402

EP2, EP4 = "parallel.expert_parallel_size=2", "parallel.expert_parallel_size=4"
TP2, SP = "parallel.tensor_parallel_size=2", "parallel.sequence_parallel=true"
PP2, CP2 = "parallel.pipeline_parallel_size=2", "parallel.context_parallel_size=2"
# two model chunks a rank: interleaved 1F1B's loop, or ZB-V's V (engine/interleaved.py)
V2, ZBV = "parallel.virtual_pipeline_size=2", "parallel.pipeline_schedule=zbv"
INTERLEAVED, FREQ1 = "parallel.pipeline_schedule=interleaved", "model.moe.layer_freq=1"
ZERO = "parallel.zero_stage={}".format
BIAS, SHARED = "model.moe.router_bias_update_rate=0.01", "model.moe.shared_expert_ffn_hidden_size=48"
# name: (world size, overrides)
LAYOUTS = {
    "one_rank": (1, []),
    "ep2_zero0": (2, [EP2, ZERO(0)]),
    "ep2_zero1": (2, [EP2, ZERO(1)]),
    "ep2_zero2": (2, [EP2, ZERO(2)]),
    # EP 1 at TP 1: every rank holds every expert, and ZeRO-3 partitions them as any parameter
    # (its hooks gather the router's weight again for the backward: router.Routing is a tuple)
    "ep1_dp2_zero3": (2, [ZERO(3)]),
    # the ep group is the tp group: each TP rank routes its sequence shard (SP) or its slice
    "ep2_tp2_sp": (2, [EP2, TP2, SP, ZERO(1)]),
    "ep2_tp2": (2, [EP2, TP2, ZERO(1)]),
    # EP 1 under TP: both TP ranks hold every expert, trained on other tokens
    "ep1_tp2_sp_zero0": (2, [TP2, SP, ZERO(0)]),
    "ep2_cp2": (2, [EP2, CP2, ZERO(1)]),
    "ep2_recompute_full": (2, [EP2, ZERO(1), "training.activation_checkpointing=full"]),
    "ep4_zero1": (4, [EP4, ZERO(1)]),
    "ep2dp4_zero1": (4, [EP2, ZERO(1)]),
    "ep2_tp2_sp_dp2_zero2": (4, [EP2, TP2, SP, ZERO(2)]),
    "ep4_tp2_dp2": (4, [EP4, TP2, ZERO(1)]),
    "ep2_pp2_1f1b": (4, [EP2, PP2, ZERO(1)]),
    "ep2_pp2_zbh1": (4, [EP2, PP2, ZERO(1), "parallel.pipeline_schedule=zbh1"]),
    "ep2_cp2_tp2_sp": (4, [EP2, CP2, TP2, SP, ZERO(1)]),
    "ep2_tp2_sp_pp2": (4, [EP2, TP2, SP, PP2, ZERO(1)]),
    # model chunks: under ZB-V's V rank 0 holds layers 0 and 3, rank 1 layers 1 and 2, so MoE
    # every 2nd layer puts one on each; the interleaved loop gives rank 1 layers 1 and 3, which
    # that frequency leaves without one (refused: validate.check_experts), so every layer is MoE
    # there, against its own one-rank run
    "ep2_pp2_zbv": (4, [EP2, PP2, ZERO(1), V2, ZBV]),
    "freq1_one_rank": (1, [FREQ1]),
    "freq1_ep2_pp2_interleaved": (4, [EP2, PP2, ZERO(1), V2, INTERLEAVED, FREQ1]),
    # the auxiliary-loss-free router bias (its loads summed over every rank of a stage) and a
    # shared expert, against their own one-rank run
    "bias_one_rank": (1, [BIAS, SHARED]),
    "bias_ep2_tp2": (2, [EP2, TP2, ZERO(1), BIAS, SHARED]),
    "bias_ep2_tp2_sp_pp2": (4, [EP2, TP2, SP, PP2, ZERO(1), BIAS, SHARED]),
    "bias_ep2_tp2_sp_pp2_zbv": (4, [EP2, TP2, SP, PP2, ZERO(1), BIAS, SHARED, V2, ZBV]),
}
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from tests.support.procs import launch_json
    out = {}
    for world in (1, 2, 4):
        layouts = [name for name, (w, _) in LAYOUTS.items() if w == world]
        tmp = tmp_path_factory.mktemp(f"world{world}")
        out.update(launch_json(world, os.path.abspath(__file__), str(tmp / "out.json"),
                               "--workdir", str(tmp), "--layouts", ",".join(layouts),
                               plain_single=True))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("layout", [n for n in LAYOUTS if not n.endswith("one_rank")])
def test_expert_parallel_training_matches_one_rank(results, layout):
    """Losses (language model), gradient norms (clipping on) and the routers' auxiliary losses
    of every step, against one rank (with the router bias and a shared expert, or MoE in every
    layer: its own)."""
    prefix = layout.split("_")[0] + "_" if layout.startswith(("bias_", "freq1_")) else ""
    ref = results[prefix + "one_rank"]
    got = results[layout]
    assert len(got["loss"]) == 10 and ref["loss"][-1] < ref["loss"][0] - 0.05, ref
    for key in ("loss", "grad_norm", "aux"):
        assert len(got[key]) == len(ref[key]) == 10, (key, got)
        diff = max(abs(a - b) for a, b in zip(ref[key], got[key]))
        print(f"{layout}: max {key} difference {diff:.3g}")
        assert diff < TOLERANCE, (layout, key, diff, ref[key], got[key])


@pytest.mark.slow
@pytest.mark.parametrize("capacity", ["dropless", "capacity"])
def test_one_moe_layer_at_ep2_matches_one_rank(results, capacity):
    check = results[f"layer_{capacity}"]
    print(f"layer {capacity}: {check}")
    for key in ("output", "experts_grad", "router_grad", "input_grad"):
        assert check[key] < TOLERANCE, (key, check)
    assert (check["dropped"] > 0) == (capacity == "capacity"), check


def _layer_check(factor):
    """One MoE layer at EP2 against the whole layer on this rank, the same weights: outputs,
    input gradients, this rank's experts' gradients (the all-to-all's backward sums both ranks'
    tokens) and the router's gradient summed over the ranks."""
    import torch
    import torch.distributed as dist
    from megatron.config import load_config
    from megatron.model import build_context
    from megatron.model.moe import MoELayer
    from megatron.parallel.state import ParallelState
    extra = [] if factor is None else [f"model.moe.capacity_factor={factor}"]
    state = ParallelState.build(1, 1)
    rank, out = dist.get_rank(), {}
    layers = {}
    for ep in (1, 2):
        cfg = load_config(TINY, MOE + extra + [f"parallel.expert_parallel_size={ep}"])
        layers[ep] = MoELayer(cfg.model, build_context(cfg, state, 512), 0)
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(16, 2, 64, generator=g) for _ in range(2)]
    grads = [torch.randn(16, 2, 64, generator=g) for _ in range(2)]
    ref_in = [x.clone().requires_grad_() for x in xs]
    ref_out = []
    for x, gy in zip(ref_in, grads):  # both ranks' tokens, one micro-batch at a time
        ref_out.append(layers[1](x))
        (ref_out[-1] * gy).sum().backward()  # the auxiliary losses ride on the output
    x = xs[rank].clone().requires_grad_()
    y = layers[2](x)
    (y * grads[rank]).sum().backward()
    router = layers[2].router.weight.grad.clone()
    dist.all_reduce(router)
    local = slice(rank * 2, rank * 2 + 2)
    pairs = {"output": (y, ref_out[rank]), "input_grad": (x.grad, ref_in[rank].grad),
             "router_grad": (router, layers[1].router.weight.grad),
             "experts_grad": (torch.cat([layers[2].experts.w1.grad.flatten(),
                                         layers[2].experts.w2.grad.flatten()]),
                              torch.cat([layers[1].experts.w1.grad[local].flatten(),
                                         layers[1].experts.w2.grad[local].flatten()]))}
    out = {k: float((a - b).abs().max()) for k, (a, b) in pairs.items()}
    out["dropped"] = layers[2].stats.dropped
    return out


def _worker(out: str, workdir: str, layouts) -> int:
    import torch.distributed as dist
    from megatron.base.records import StepRecord, read_metrics
    from megatron.base.rundir import RunDir
    from megatron.config import load_config
    from megatron.training.loop import train
    results = {}
    for name in layouts:
        run_dir = f"{workdir}/{name}"
        cfg = load_config(TINY, MOE + LAYOUTS[name][1] + [f"run.dir={run_dir}",
                                                          "training.log_interval=1"])
        summary = train(cfg)
        if not dist.is_initialized() or dist.get_rank() == 0:
            steps = [r for r in read_metrics(RunDir(run_dir).metrics)
                     if isinstance(r, StepRecord)]
            results[name] = {"loss": summary.losses, "grad_norm": [r.grad_norm for r in steps],
                             "aux": [sum(layer["aux_loss"] + layer["z_loss"]
                                         for layer in r.moe or []) for r in steps]}
    if dist.is_initialized() and dist.get_world_size() == 2:
        results["layer_dropless"] = _layer_check(None)
        results["layer_capacity"] = _layer_check(0.5)
    if not dist.is_initialized() or dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    from tests.support.worker_exit import exit_after
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--layouts", required=True)
    args = p.parse_args()
    exit_after(lambda: _worker(args.out, args.workdir, args.layouts.split(",")))
