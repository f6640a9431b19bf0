"""Our MoE layer (megatron/model/moe) against transformers' MixtralSparseMoeBlock of the same
shape: one rank, dropless, forward + backward (input and weight gradients), tokens per second,
in one process, rounds alternated so both see the same machine load. On the CPU in fp32; with
--device cuda on one GPU in bf16 at Mixtral-sized layers, timed between device synchronisations,
with TFLOP/s, and which dtypes the grouped GEMM takes there (experts.grouped_gemm_works).

Both get the same weights (ours copied into Mixtral's stacked layout: router -> gate, fc1
[gate; up] -> gate_up_proj, fc2 -> down_proj) and the same tokens, so they route alike; the
script checks that their outputs agree before timing. Our layer runs as Mixtral's: SwiGLU, no
biases, the softmax_renorm router, no auxiliary losses (coefficients 0).

    python benchmarks/moe/bench_layer.py          # -> benchmarks/results/moe_layer.{json,md}
    python benchmarks/moe/bench_layer.py --quick  # one small shape, few rounds (a dry run)
    python benchmarks/moe/bench_layer.py --device cuda   # -> moe_layer_<gpu>.{json,md}
"""
from __future__ import annotations

import argparse
import contextlib
import copy
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
GPU_SHAPES = [  # bf16 on one GPU: Mixtral 8x7B's layer (4096, 14336), and a narrower one
    (4096, 14336, 8192),
    (2048, 2048, 16384),
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


def _tensor(y):
    """Some transformers releases return (hidden, router logits) from the sparse block."""
    return y[0] if isinstance(y, tuple) else y


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def step(module, x: torch.Tensor) -> None:
    """Forward and backward of a [T, 1, h] batch (Mixtral takes [1, T, h])."""
    x = x.detach().requires_grad_(True)
    y = _tensor(module(x))
    y.float().square().mean().backward()
    module.zero_grad(set_to_none=True)


def agree(layer, block, x: torch.Tensor) -> dict:
    """Largest absolute output difference, and the difference's norm relative to ours."""
    with torch.no_grad():
        a = layer(x).float()
        b = _tensor(block(x.transpose(0, 1))).transpose(0, 1).float()
    return {"max_abs": float((a - b).abs().max()),
            "rel_norm": float((a - b).norm() / a.norm().clamp_min(1e-30))}


@contextlib.contextmanager
def built_on(device: str):
    """Modules built on `device`. On a GPU the experts' weights are drawn there in one call
    (the model's per-line seeded draw on the CPU, the same in every layout, takes about 20 s
    for a Mixtral-sized layer, and values do not matter to speed; both sides get the same)."""
    if device == "cpu":
        yield
        return
    from megatron.model.moe import experts as experts_module
    saved = experts_module._stack
    experts_module._stack = lambda shape, std, seed, layer, name, experts: \
        torch.randn(len(experts), *shape, device=device) * std
    try:
        with torch.device(device):
            yield
    finally:
        experts_module._stack = saved


def measure(h: int, f: int, tokens: int, rounds: int, impls, device="cpu",
            dtype=torch.float32) -> dict:
    torch.manual_seed(0)
    with built_on(device):
        layer = ours(h, f).to(device, dtype)
        blocks = {name: mixtral(layer, h, f, name).to(device, dtype) for name in impls}
    x = torch.randn(tokens, 1, h, device=device, dtype=dtype)
    diffs = {name: agree(layer, b, x) for name, b in blocks.items()}
    loop = copy.deepcopy(layer)
    loop.experts.grouped = False  # the per-expert loop, the CPU's path before the grouped GEMM
    runs = {"ours": lambda: step(layer, x), "ours_loop": lambda: step(loop, x)}
    runs.update({f"mixtral_{n}": (lambda b=b: step(b, x.transpose(0, 1))) for n, b in blocks.items()})
    times = {k: [] for k in runs}
    for fn in runs.values():  # warm-up
        fn()
        fn()
    sync(device)
    for _ in range(rounds):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    tps = {k: tokens / v for k, v in med.items()}
    # The experts' products only (router and permutes left out): fc1 is 2f wide under SwiGLU.
    flops = 3 * 2 * tokens * TOP_K * (h * 2 * f + f * h)
    return {"hidden": h, "ffn": f, "tokens": tokens, "experts": EXPERTS, "top_k": TOP_K,
            "dtype": str(dtype).replace("torch.", ""), "rounds": rounds, "median_s": med,
            "tokens_per_s": tps, "expert_tflops": {k: flops / v / 1e12 for k, v in med.items()},
            "ratio_vs": {k: tps["ours"] / v for k, v in tps.items() if k != "ours"},
            "grouped_vs_loop": med["ours_loop"] / med["ours"],
            "max_abs_output_diff": {k: v["max_abs"] for k, v in diffs.items()},
            "rel_output_diff": {k: v["rel_norm"] for k, v in diffs.items()}}


def implementations(device="cpu", dtype=torch.float32) -> list:
    """The Mixtral experts implementations that run forward and backward here."""
    ok = []
    for name in ("eager", "grouped_mm"):  # batched_mm gathers a weight per token: slower still
        try:
            layer = ours(64, 128).to(device, dtype)
            step(mixtral(layer, 64, 128, name).to(device, dtype),
                 torch.randn(1, 16, 64, device=device, dtype=dtype))
            ok.append(name)
        except Exception as e:  # an implementation this torch lacks here
            print(f"mixtral experts_implementation={name}: skipped ({type(e).__name__}: {e})"[:200])
    return ok


def grouped_support(device: str, h: int, f: int) -> dict:
    """dtype -> None when the grouped GEMM runs our layer's products there, else why not."""
    from megatron.model.moe.experts import grouped_gemm_works
    return {str(dt).replace("torch.", ""): grouped_gemm_works(torch.device(device), dt, h, 2 * f, f)
            for dt in (torch.bfloat16, torch.float16, torch.float32)}


def markdown(results: list, env: dict) -> str:
    impls = [k for k in results[0]["tokens_per_s"] if k.startswith("mixtral")]
    where = env.get("title", "CPU, fp32")
    lines = [f"# MoE layer against transformers' MixtralSparseMoeBlock ({where})", "",
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
        rel = r.get("rel_output_diff")
        cells.append(f"{max(r['max_abs_output_diff'].values()):.1e}" +
                     (f" (relative {max(rel.values()):.1e})" if rel else ""))
        cells.append(f"{r['tokens_per_s']['ours_loop']:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    if "expert_tflops" in results[0]:
        lines += ["", "Experts' products only (3 x 2 x tokens x top-k x 3hf FLOPs for SwiGLU), "
                  "TFLOP/s:", "", "| hidden | ffn | tokens | " + " | ".join(
                      results[0]["expert_tflops"]) + " |",
                  "|---|---|---|" + "---|" * len(results[0]["expert_tflops"])]
        for r in results:
            lines.append(f"| {r['hidden']} | {r['ffn']} | {r['tokens']} | " + " | ".join(
                f"{v:.0f}" for v in r["expert_tflops"].values()) + " |")
    if env.get("grouped_support"):
        lines += ["", "The grouped GEMM on this device (`experts.grouped_gemm_works`; where it "
                  "does not run, the layer takes the per-expert loop):", ""]
        for dt, why in env["grouped_support"].items():
            lines.append(f"- {dt}: {'runs' if why is None else 'does not run: ' + why}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="cuda: one GPU, bf16, the Mixtral-sized shapes (default: cpu, fp32)")
    args = ap.parse_args()
    import transformers
    gpu = args.device == "cuda"
    if gpu and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no GPU here")
    dtype = torch.bfloat16 if gpu else torch.float32
    impls = implementations(args.device, dtype)
    shapes = (GPU_SHAPES if gpu else SHAPES)[:1 if args.quick else None]
    rounds = 2 if args.quick else args.rounds
    if gpu:
        name = torch.cuda.get_device_name(0)
        env = {"machine": f"{name}, {platform.machine()} host with {os.cpu_count()} cores",
               "title": f"{name}, bf16"}
        stem = "moe_layer_" + "_".join("".join(c if c.isalnum() else " " for c in
                                                name.lower()).split())
    else:
        env, stem = {"machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)"}, \
            "moe_layer"
    env.update(torch=torch.__version__, transformers=transformers.__version__,
               threads=torch.get_num_threads(),
               grouped_support=grouped_support(args.device, *shapes[0][:2]))
    print(json.dumps(env))
    results = []
    for h, f, t in shapes:
        r = measure(h, f, t, rounds, impls, args.device, dtype)
        print(json.dumps(r))
        results.append(r)
        if gpu:
            del r
            torch.cuda.empty_cache()
    if args.quick:
        return
    with open(os.path.join(args.out, f"{stem}.json"), "w") as fh:
        json.dump({"env": env, "results": results}, fh, indent=1)
    with open(os.path.join(args.out, f"{stem}.md"), "w") as fh:
        fh.write(markdown(results, env))


if __name__ == "__main__":
    main()
