"""Worker for tests/distributed/test_model_moe.py, in the launches shared with the other
distributed modules (tests/support/launch_batches.py), or alone:

    torchrun --nproc_per_node 2 tests/support/moe_worker.py --out r.json --workdir /tmp/w \\
        --layouts ep2_zero0,ep2_tp2

It trains each named layout (10 steps, tests/support/moe.py's settings) and writes rank 0's
losses, gradient norms and auxiliary losses; at 2 ranks it adds the one-layer check at EP2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, when run by path
from moe import MOE  # noqa: E402
from paths import TINY  # noqa: E402
from worker_exit import exit_after, groups_ended  # noqa: E402

EP2, EP4 = "parallel.expert_parallel_size=2", "parallel.expert_parallel_size=4"
TP2, SP = "parallel.tensor_parallel_size=2", "parallel.sequence_parallel=true"
PP2, CP2 = "parallel.pipeline_parallel_size=2", "parallel.context_parallel_size=2"
# two model chunks a rank: interleaved 1F1B's loop, or ZB-V's V (engine/interleaved.py)
V2, ZBV = "parallel.virtual_pipeline_size=2", "parallel.pipeline_schedule=zbv"
INTERLEAVED, FREQ1 = "parallel.pipeline_schedule=interleaved", "model.moe.layer_freq=1"
ZERO = "parallel.zero_stage={}".format
BIAS = "model.moe.router_bias_update_rate=0.01"
SHARED = "model.moe.shared_expert_ffn_hidden_size=48"
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
        for name, factor in (("layer_dropless", None), ("layer_capacity", 0.5)):
            with groups_ended():  # the check's own ParallelState
                results[name] = _layer_check(factor)
    if not dist.is_initialized() or dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--layouts", required=True)
    args = p.parse_args()
    return _worker(args.out, args.workdir, args.layouts.split(","))


if __name__ == "__main__":
    exit_after(main)
