"""Auxiliary-loss-free balancing (model.moe.router_bias_update_rate) on a skewed router: the
max/mean tokens per expert before and after a short run of steps, with the bias off and on,
for the sigmoid and softmax routers.

The router alone (megatron/model/moe/router.py), 8 experts, top-2, hidden 64: tokens are noise
plus a common direction v, and the router's row 0 leans 2 x along v, so expert 0 is most
tokens' first choice. Each step routes 1024 fresh tokens, then update_bias moves the bias as
the training loop does after an optimizer step. The router weights stay fixed: the bias alone
balances (a training run also moves the weights).

    python benchmarks/moe/bench_router_bias.py   # -> benchmarks/results/moe_router_bias.{json,md}
"""
from __future__ import annotations

import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

STEPS, TOKENS, EXPERTS = 200, 1024, 8


def run(router_kind: str, rate: float) -> dict:
    from megatron.config import load_config
    from megatron.model import build_context
    from megatron.model.moe.router import Router, update_bias
    from megatron.parallel.state import ParallelState
    cfg = load_config(os.path.join(ROOT, "examples/local/tiny.yaml"),
                      [f"model.moe.num_experts={EXPERTS}", "model.moe.top_k=2",
                       f"model.moe.router={router_kind}",
                       f"model.moe.router_bias_update_rate={rate}"])
    router = Router(cfg.model, build_context(cfg, ParallelState.single(), 512), 0).train()
    torch.manual_seed(0)
    v = torch.randn(cfg.model.hidden_size)
    v = v / v.norm()
    with torch.no_grad():
        router.weight[0] += 2 * v
    gen = torch.Generator().manual_seed(1)
    ratios = []
    for _ in range(STEPS):
        x = torch.randn(TOKENS, v.numel(), generator=gen) + v
        counts = torch.bincount(router(x).experts.reshape(-1), minlength=EXPERTS).float()
        ratios.append(float(counts.max() / counts.mean()))
        update_bias([router])
    last = ratios[-20:]
    return {"router": router_kind, "rate": rate, "first": ratios[0],
            "last20_mean": sum(last) / len(last), "last20_max": max(last),
            "every_20": ratios[::20]}


def main() -> None:
    rows = [run(kind, rate) for kind in ("sigmoid", "softmax") for rate in (0.0, 0.001, 0.01)]
    out = os.path.join(ROOT, "benchmarks", "results")
    with open(os.path.join(out, "moe_router_bias.json"), "w") as fh:
        json.dump({"steps": STEPS, "tokens": TOKENS, "experts": EXPERTS, "rows": rows}, fh,
                  indent=1)
    lines = ["# Router bias (auxiliary-loss-free balancing) on a skewed router", "",
             f"{EXPERTS} experts, top-2, {TOKENS} tokens a step, {STEPS} steps; max/mean tokens "
             "per expert (4.0: every token's first choice is one expert; 1.0: even). The router "
             "weights are fixed, only the bias moves (`benchmarks/moe/bench_router_bias.py`).", "",
             "| router | rate | max/mean, step 1 | mean of the last 20 steps | max of the last 20 |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['router']} | {r['rate']} | {r['first']:.2f} | "
                     f"{r['last20_mean']:.2f} | {r['last20_max']:.2f} |")
    lines += ["", "With softmax the experts other than the favourite share a small probability, "
              "so one bias step reorders them all at once and the load swings; DeepSeek-V3 "
              "biases sigmoid scores, the pairing docs/moe.md recommends."]
    with open(os.path.join(out, "moe_router_bias.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    for r in rows:
        print(r["router"], r["rate"], f"{r['first']:.2f} -> {r['last20_mean']:.2f}")


if __name__ == "__main__":
    main()
