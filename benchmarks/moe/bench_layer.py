"""Our MoE layer (megatron/model/moe) against transformers' MixtralSparseMoeBlock of the same
shape on the CPU: one rank, fp32, dropless, forward + backward (input and weight gradients),
tokens per second, in one process, rounds alternated so both see the same machine load.

Both get the same weights (ours copied into Mixtral's stacked layout: router -> gate, fc1
[gate; up] -> gate_up_proj, fc2 -> down_proj) and the same tokens, so they route alike; the
script checks that their outputs agree before timing. Our layer runs as Mixtral's: SwiGLU, no
biases, the softmax_renorm router, no auxiliary losses (coefficients 0).

    python benchmarks/moe/bench_layer.py          # -> benchmarks/results/moe_layer.{json,md}
    python benchmarks/moe/bench_layer.py --quick  # one small shape, few rounds (a dry run)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

SHAPES = [  # (hidden, expert ffn, tokens): small, for a 2-core CPU shared with other jobs
    (256, 512, 1024),
    (128, 256, 2048),
]
EXPERTS, TOP_K = 8, 2


def ours(h: int, f: int):
    from megatron.config import load_config
    from megatron.model import build_context
    from megatron.model.moe import MoELayer
    from megatron.parallel.state import ParallelState
    sets = [f"model.hidden_size={h}", "model.num_attention_heads=4", "model.activation=swiglu",
            "model.add_bias_linear=false", f"model.moe.num_experts={EXPERTS}",
            f"model.moe.top_k={TOP_K}", f"model.moe.ffn_hidden_size={f}",
            "model.moe.router=softmax_renorm", "model.moe.aux_loss_coeff=0",
            "model.moe.z_loss_coeff=0"]
    cfg = load_config(os.path.join(ROOT, "examples/local/tiny.yaml"), sets)
    return MoELayer(cfg.model, build_context(cfg, ParallelState.single(), 512), 0).train()


def mixtral(layer, h: int, f: int, implementation: str):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    cfg = MixtralConfig(hidden_size=h, intermediate_size=f, num_local_experts=EXPERTS,
                        num_experts_per_tok=TOP_K, router_jitter_noise=0.0)
    cfg._experts_implementation = implementation
    block = MixtralSparseMoeBlock(cfg).train()
    with torch.no_grad():
        block.gate.weight.copy_(layer.router.weight)
        block.experts.gate_up_proj.copy_(layer.experts.w1)
        block.experts.down_proj.copy_(layer.experts.w2)
    return block


def step(module, x: torch.Tensor) -> None:
    """Forward and backward of a [T, 1, h] batch (Mixtral takes [1, T, h])."""
    x = x.detach().requires_grad_(True)
    y = module(x)
    y.float().square().mean().backward()
    module.zero_grad(set_to_none=True)


def agree(layer, block, x: torch.Tensor) -> float:
    with torch.no_grad():
        a = layer(x)
        b = block(x.transpose(0, 1)).transpose(0, 1)
    return float((a - b).abs().max())


def measure(h: int, f: int, tokens: int, rounds: int, impls) -> dict:
    torch.manual_seed(0)
    layer = ours(h, f)
    blocks = {name: mixtral(layer, h, f, name) for name in impls}
    x = torch.randn(tokens, 1, h)
    diffs = {name: agree(layer, b, x) for name, b in blocks.items()}
    loop = ours(h, f)
    loop.load_state_dict(layer.state_dict())
    loop.experts.grouped = False  # the per-expert loop, the CPU's path before the grouped GEMM
    runs = {"ours": lambda: step(layer, x), "ours_loop": lambda: step(loop, x)}
    runs.update({f"mixtral_{n}": (lambda b=b: step(b, x.transpose(0, 1))) for n, b in blocks.items()})
    times = {k: [] for k in runs}
    for fn in runs.values():  # warm-up
        fn()
        fn()
    for _ in range(rounds):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    tps = {k: tokens / v for k, v in med.items()}
    return {"hidden": h, "ffn": f, "tokens": tokens, "experts": EXPERTS, "top_k": TOP_K,
            "rounds": rounds, "median_s": med, "tokens_per_s": tps,
            "ratio_vs": {k: tps["ours"] / v for k, v in tps.items() if k != "ours"},
            "grouped_vs_loop": med["ours_loop"] / med["ours"],
            "max_abs_output_diff": diffs}


def implementations() -> list:
    """The Mixtral experts implementations that run forward and backward on this CPU."""
    ok = []
    for name in ("eager", "grouped_mm"):  # batched_mm gathers a weight per token: slower still
        try:
            layer = ours(64, 128)
            step(mixtral(layer, 64, 128, name), torch.randn(1, 16, 64))
            ok.append(name)
        except Exception as e:  # an implementation this torch lacks on the CPU
            print(f"mixtral experts_implementation={name}: skipped ({type(e).__name__}: {e})"[:200])
    return ok


def markdown(results: list, env: dict) -> str:
    impls = [k for k in results[0]["tokens_per_s"] if k.startswith("mixtral")]
    lines = ["# MoE layer against transformers' MixtralSparseMoeBlock (CPU, fp32)", "",
             f"One rank, dropless, {EXPERTS} experts, top-{TOP_K}, SwiGLU, no biases, forward + "
             "backward (input and weight gradients), median of alternated rounds in one "
             "process (`benchmarks/moe/bench_layer.py`). Tokens/s; ratio = ours / theirs "
             "(> 1: ours faster).", "",
             f"Machine: {env['machine']}; torch {env['torch']}, transformers "
             f"{env['transformers']}, {env['threads']} threads.", "",
             "| hidden | ffn | tokens | ours tok/s | " + " | ".join(
                 f"{k} tok/s | ours / {k}" for k in impls) + " | max abs diff | ours with the loop, tok/s |",
             "|---|---|---|---|" + "---|---|" * len(impls) + "---|---|"]
    for r in results:
        cells = [str(r["hidden"]), str(r["ffn"]), str(r["tokens"]),
                 f"{r['tokens_per_s']['ours']:.0f}"]
        for k in impls:
            cells += [f"{r['tokens_per_s'][k]:.0f}", f"{r['ratio_vs'][k]:.2f}x"]
        cells.append(f"{max(r['max_abs_output_diff'].values()):.1e}")
        cells.append(f"{r['tokens_per_s']['ours_loop']:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    args = ap.parse_args()
    import transformers
    impls = implementations()
    shapes = SHAPES[:1] if args.quick else SHAPES
    rounds = 2 if args.quick else args.rounds
    results = []
    for h, f, t in shapes:
        r = measure(h, f, t, rounds, impls)
        print(json.dumps(r))
        results.append(r)
    env = {"machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)",
           "torch": torch.__version__, "transformers": transformers.__version__,
           "threads": torch.get_num_threads()}
    if args.quick:
        return
    with open(os.path.join(args.out, "moe_layer.json"), "w") as fh:
        json.dump({"env": env, "results": results}, fh, indent=1)
    with open(os.path.join(args.out, "moe_layer.md"), "w") as fh:
        fh.write(markdown(results, env))


if __name__ == "__main__":
    main()
