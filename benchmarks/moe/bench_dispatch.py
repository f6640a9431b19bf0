"""The dispatch's share of a MoE layer's forward + backward at expert parallelism 2 and 4, on CPU
ranks (gloo): the time spent inside torch.distributed.all_to_all_single (the per-expert counts,
the rows out and back, and the reverse exchanges of the backward) against the whole step.

Each rank times every call of dist.all_to_all_single (a wrapper around the module attribute
that the layer's dispatch and torch.distributed.nn's autograd all-to-all both call), so the
exchange time includes waiting for the slowest rank; the rest is routing, permutation, experts
and combine. Run by the launcher here, which starts torchrun for each EP size:

    python benchmarks/moe/bench_dispatch.py           # -> benchmarks/results/moe_dispatch.{json,md}
    python benchmarks/moe/bench_dispatch.py --quick   # small shape, EP2 only (a dry run)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HIDDEN, FFN, TOKENS, EXPERTS, TOP_K = 256, 512, 2048, 8, 2


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    sys.path.insert(0, ROOT)
    from megatron.config import load_config
    from megatron.model import build_context
    from megatron.model.moe import MoELayer
    from megatron.parallel.experts import build_expert_parallel
    from megatron.parallel.state import ParallelState

    torch.set_num_threads(1)  # ranks share the cores
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    state = ParallelState.build(tp=1, pp=1)
    sets = [f"model.hidden_size={args.hidden}", "model.num_attention_heads=4",
            "model.activation=swiglu", "model.add_bias_linear=false",
            f"model.moe.num_experts={EXPERTS}", f"model.moe.top_k={TOP_K}",
            f"model.moe.ffn_hidden_size={args.ffn}", "model.moe.router=softmax_renorm"]
    cfg = load_config(os.path.join(ROOT, "examples/local/tiny.yaml"), sets)
    ctx = build_context(cfg, state, 512)
    ctx.expert = build_expert_parallel(state, world)
    layer = MoELayer(cfg.model, ctx, 0).train()

    spent = [0.0]
    original = dist.all_to_all_single

    def timed(*a, **k):
        t0 = time.perf_counter()
        out = original(*a, **k)
        spent[0] += time.perf_counter() - t0
        return out
    dist.all_to_all_single = timed

    torch.manual_seed(100 + rank)  # each rank its own tokens, as data-parallel ranks have
    x = torch.randn(args.tokens, 1, args.hidden)
    steps, exchange = [], []
    for i in range(args.warmup + args.steps):
        dist.barrier()
        spent[0] = 0.0
        t0 = time.perf_counter()
        xi = x.detach().requires_grad_(True)
        layer(xi).square().mean().backward()
        layer.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        if i >= args.warmup:
            steps.append(dt)
            exchange.append(spent[0])
    out = [None] * world
    dist.all_gather_object(out, {"step": statistics.median(steps),
                                 "exchange": statistics.median(exchange)})
    if rank == 0:
        with open(args.result, "w") as fh:
            json.dump(out, fh)
    dist.destroy_process_group()


def launch(ep: int, args) -> dict:
    result = os.path.join(args.tmp, f"dispatch_ep{ep}.json")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ep}",
           "--standalone", os.path.abspath(__file__), "--worker",
           "--result", result, "--hidden", str(args.hidden), "--ffn", str(args.ffn),
           "--tokens", str(args.tokens), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    with open(result) as fh:
        ranks = json.load(fh)
    step = statistics.mean(r["step"] for r in ranks)
    exch = statistics.mean(r["exchange"] for r in ranks)
    return {"ep": ep, "ranks": ranks, "step_s": step, "exchange_s": exch,
            "exchange_share": exch / step}


def markdown(rows, args) -> str:
    lines = ["# MoE dispatch: the all-to-all's share of a MoE layer's step (CPU ranks, gloo)", "",
             f"One MoE layer, {EXPERTS} experts split over EP ranks, top-{TOP_K}, SwiGLU, hidden "
             f"{args.hidden}, expert ffn {args.ffn}, {args.tokens} tokens per rank, fp32, "
             "dropless, forward + backward; one thread per rank, the ranks on one host's "
             "shared cores (`benchmarks/moe/bench_dispatch.py`). Exchange: time inside "
             "`dist.all_to_all_single` (counts, rows out and back, their backward), waiting "
             "for the slowest rank included; medians over steps, averaged over ranks.", "",
             "| EP | step (s) | exchange (s) | exchange share | rest (s) |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['ep']} | {r['step_s']:.3f} | {r['exchange_s']:.3f} | "
                     f"{r['exchange_share']:.1%} | {r['step_s'] - r['exchange_s']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--hidden", type=int, default=HIDDEN)
    ap.add_argument("--ffn", type=int, default=FFN)
    ap.add_argument("--tokens", type=int, default=TOKENS)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--tmp", default="/tmp")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.tokens, args.steps, args.warmup = 256, 2, 1
    rows = [launch(ep, args) for ep in ((2,) if args.quick else (2, 4))]
    for r in rows:
        print(json.dumps(r))
    if args.quick:
        return
    with open(os.path.join(args.out, "moe_dispatch.json"), "w") as fh:
        json.dump({"hidden": args.hidden, "ffn": args.ffn, "tokens": args.tokens,
                   "experts": EXPERTS, "top_k": TOP_K, "rows": rows}, fh, indent=1)
    with open(os.path.join(args.out, "moe_dispatch.md"), "w") as fh:
        fh.write(markdown(rows, args))


if __name__ == "__main__":
    main()
