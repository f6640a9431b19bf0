#!/usr/bin/env python3
"""Fused kernels against torch eager, and attention paths, on one GPU.

    python benchmarks/kernels/bench_kernels.py [--out benchmarks/results] [--quick]

For each fused op (forward, and forward+backward) at GPT shapes: median time over CUDA-event
timed repetitions, the bytes the op must move at least (inputs read once, outputs written
once), achieved GB/s and its share of the GPU's peak memory bandwidth and of a measured
device-to-device copy, and the speed-up over what kernels.mode=torch runs for the same call
(megatron.kernels.ops without a selection: torch's own LayerNorm/RMSNorm, GeLU and SiLU kernels
in the input's dtype and the 16-bit rotary on a GPU, the references of reference.py for the
softmaxes). Then
causal attention at sequence 2048: math with the fused softmax, math with the eager softmax,
torch SDPA, and flash-attn when installed, as time and TFLOP/s. Writes kernels_<gpu>.json and
kernels_<gpu>.md. Needs a GPU; on a CPU it exits with a message.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from megatron.config import devices  # noqa: E402
from megatron.kernels import catalog, fused, loader, ops, reference  # noqa: E402
from megatron.launch.device import gpu_arch, torch_toolkit  # noqa: E402

def peak_gbps(name: str):
    """HBM GB/s of the named device (megatron/config/devices.py), None when unknown."""
    return devices.lookup(devices.PEAK_HBM_GBPS, name)


def timed(fn, reps: int) -> float:
    """Median milliseconds of fn() over `reps` event-timed calls after warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_gbps(reps: int) -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), reps)
    return 2 * src.numel() / ms / 1e6


def fwd_bwd(fn, inputs):
    def run():
        for t in inputs:
            t.grad = None
        out = fn(*inputs)
        out.backward(torch.ones_like(out))
    return run


# (micro-batch, sequence, hidden, heads): the default GPT shapes, --quick's, and the 1.3B GPT of
# benchmarks/e2e (its layer's norms, activations and rotary at the sizes the trainer runs).
SHAPES = {"default": (4, 2048, 8192, 64), "quick": (2, 2048, 4096, 32),
          "gpt1.3b": (8, 2048, 2048, 16)}


def cases(dtype, shape: str, dev: str = "cuda"):
    """(op, label, fused fn, eager fn, input factory, bytes fwd, bytes fwd+bwd)."""
    b, s, h, heads = SHAPES[shape]
    quick = shape == "quick"
    e = torch.tensor([], dtype=dtype).element_size()

    def t(*shape, grad=True, scale=1.0):
        return (torch.randn(*shape, device=dev) * scale).to(dtype).requires_grad_(grad)

    tokens = b * s * h
    inv = 1.0 / 10000 ** (torch.arange(0, 128, 2, device=dev).float() / 128)
    emb = torch.outer(torch.arange(s, device=dev).float(), inv).repeat(1, 2)[:, None, None]
    cos, sin = emb.cos(), emb.sin()
    sc = b * heads * s * s if quick else b * 16 * s * s  # 16 local heads: a TP-sharded layer
    mask = torch.rand(b, 1, s, s, device=dev) < 0.1
    return [
        # Each op's peer is the torch path kernels.mode=torch takes for the same call (ops.*
        # without a selection), not the upcast reference: the strongest peer the trainer has.
        ("layer_norm", f"[{b*s}, {h}]", lambda x, w, bb: fused.layer_norm(x, w, bb, 1e-5),
         lambda x, w, bb: ops.layer_norm(x, w, bb, 1e-5),
         lambda: (t(b * s, h), t(h), t(h)), 2 * tokens * e, 5 * tokens * e),
        ("rms_norm", f"[{b*s}, {h}]", lambda x, w: fused.rms_norm(x, w, 1e-6),
         lambda x, w: ops.rms_norm(x, w, 1e-6),
         lambda: (t(b * s, h), t(h)),
         2 * tokens * e, 5 * tokens * e),
        ("scaled_masked_softmax", f"[{b}, {sc // (b * s * s)}, {s}, {s}]",
         lambda x: fused.scaled_masked_softmax(x, mask, 0.08),
         lambda x: ops.scaled_masked_softmax(x, mask, 0.08),
         lambda: (t(b, sc // (b * s * s), s, s),), 2 * sc * e + mask.numel(),
         5 * sc * e + 2 * mask.numel()),
        ("scaled_causal_softmax", f"[{sc // (s * s)}, {s}, {s}]",
         lambda x: fused.scaled_causal_softmax(x, 0.08),
         lambda x: ops.scaled_causal_softmax(x, 0.08),
         lambda: (t(sc // (s * s), s, s),), 2 * sc * e, 5 * sc * e),
        ("rotary", f"[{s}, {b}, {heads}, 128]", lambda x: fused.rotary(x, cos, sin),
         lambda x: ops.rotary(x, cos, sin), lambda: (t(s, b, heads, 128),),
         2 * s * b * heads * 128 * e, 4 * s * b * heads * 128 * e),
        ("bias_gelu", f"[{b*s}, {4*h}]", fused.bias_gelu, ops.bias_gelu,
         lambda: (t(b * s, 4 * h), t(4 * h)), 2 * 4 * tokens * e, 5 * 4 * tokens * e),
        ("swiglu", f"[{b*s}, {4*h}]", fused.swiglu, ops.swiglu,
         lambda: (t(b * s, 4 * h), t(b * s, 4 * h)), 3 * 4 * tokens * e, 8 * 4 * tokens * e),
    ]


def bench_ops(dtype, reps, shapes, peak, copy):
    rows = []
    for op, shape, fused_fn, eager_fn, make, bytes_fwd, bytes_both in cases(dtype, shapes):
        inputs = make()
        with torch.no_grad():
            f_ms = timed(lambda: fused_fn(*inputs), reps)
            e_ms = timed(lambda: eager_fn(*inputs), reps)
        fb_ms = timed(fwd_bwd(fused_fn, inputs), reps)
        eb_ms = timed(fwd_bwd(eager_fn, inputs), reps)
        row = {"op": op, "shape": shape, "dtype": str(dtype).replace("torch.", "")}
        for tag, ms, nbytes, ref in (("fwd", f_ms, bytes_fwd, e_ms), ("fwd_bwd", fb_ms, bytes_both,
                                                                       eb_ms)):
            gbps = nbytes / ms / 1e6
            row[tag] = {"fused_ms": round(ms, 4), "eager_ms": round(ref, 4),
                        "speedup": round(ref / ms, 2), "gb_per_s": round(gbps, 1),
                        "share_of_peak": round(gbps / peak, 3) if peak else None,
                        "share_of_copy": round(gbps / copy, 3)}
        rows.append(row)
        print(f"{op:<22} {row['dtype']:<9} fwd {f_ms:7.3f} ms {row['fwd']['gb_per_s']:7.0f} GB/s "
              f"x{row['fwd']['speedup']:.2f}  fwd+bwd {fb_ms:7.3f} ms x{row['fwd_bwd']['speedup']:.2f}",
              flush=True)
        del inputs
    return rows


def bench_attention(reps, quick):
    b, heads, s, d = (2, 16, 2048, 128) if quick else (4, 32, 2048, 128)
    q, k, v = (torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scale = 1.0 / math.sqrt(d)
    flops = 4 * b * heads * s * s * d / 2  # causal: half the score matrix

    def math_path(softmax):
        def run():
            scores = torch.matmul(q, k.transpose(-1, -2)).view(b * heads, s, s)
            return torch.matmul(softmax(scores, scale).view(b, heads, s, s), v)
        return run

    paths = {"math + fused softmax": math_path(fused.scaled_causal_softmax),
             "math + eager softmax": math_path(reference.scaled_causal_softmax),
             "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                             is_causal=True)}
    try:
        from flash_attn import flash_attn_func
        qf, kf, vf = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        paths["flash-attn"] = lambda: flash_attn_func(qf, kf, vf, causal=True)
    except Exception as exc:  # absent, or built for another GPU/torch
        print(f"flash-attn skipped: {exc}")
    rows = []
    with torch.no_grad():
        for name, fn in paths.items():
            ms = timed(fn, reps)
            rows.append({"path": name, "shape": f"b={b} h={heads} s={s} d={d} bf16 causal",
                         "ms": round(ms, 3), "tflops": round(flops / ms / 1e9, 1)})
            print(f"attention {name:<22} {ms:8.3f} ms {rows[-1]['tflops']:7.1f} TFLOP/s",
                  flush=True)
    return rows


def markdown(result) -> str:
    lines = [f"# Fused kernels on {result['gpu']} ({result['arch']})", "",
             f"torch {result['torch']} ({result['toolkit']}); peak HBM "
             f"{result['peak_gb_per_s'] or 'unknown'} GB/s; measured copy "
             f"{result['copy_gb_per_s']:.0f} GB/s; {result['date']}", "",
             "| op | dtype | shape | fwd ms | GB/s | % peak | x eager | fwd+bwd ms | GB/s | x eager |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["ops"] + result.get("ops_gpt13b", []):
        f, fb = r["fwd"], r["fwd_bwd"]
        share = f"{100 * f['share_of_peak']:.0f}%" if f["share_of_peak"] else "?"
        lines.append(f"| {r['op']} | {r['dtype']} | {r['shape']} | {f['fused_ms']} | "
                     f"{f['gb_per_s']:.0f} | {share} | {f['speedup']} | {fb['fused_ms']} | "
                     f"{fb['gb_per_s']:.0f} | {fb['speedup']} |")
    lines += ["", "| attention path | shape | ms | TFLOP/s |", "|---|---|---|---|"]
    lines += [f"| {a['path']} | {a['shape']} | {a['ms']} | {a['tflops']} |"
              for a in result["attention"]]
    lines += ["", "Bytes are the minimum an op must move (each input read once, each output "
              "written once); x eager is the time of kernels.mode=torch's path for the call (ops.*: torch's native norms, GeLU and SiLU in the input's dtype, the 16-bit rotary; the references for the softmaxes) over the fused time."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--quick", action="store_true", help="smaller shapes, fewer repetitions")
    p.add_argument("--dtypes", default="bfloat16,float16,float32")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_kernels: no GPU is visible to torch; the fused kernels run on GPUs only. "
              "Run this on a ROCm or CUDA machine after `pip install --no-build-isolation -e .`.",
              file=sys.stderr)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    missing = {op: loader.unavailable_reason(op, dev) for op in catalog.MODULE_OF}
    missing = {op: why for op, why in missing.items() if why}
    if missing:
        print(f"bench_kernels: fused kernels unavailable here: {missing}", file=sys.stderr)
        return 2
    reps = 10 if args.quick else 30
    name = torch.cuda.get_device_name(dev)
    peak, copy = peak_gbps(name), copy_gbps(reps)
    vendor, version = torch_toolkit()
    result = {"gpu": name, "arch": gpu_arch(dev.index), "torch": torch.__version__,
              "toolkit": f"{vendor} {version}", "peak_gb_per_s": peak, "copy_gb_per_s": copy,
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "ops": [],
              "attention": []}
    print(f"{name}: peak {peak} GB/s, measured copy {copy:.0f} GB/s", flush=True)
    for dtype in args.dtypes.split(","):
        result["ops"] += bench_ops(getattr(torch, dtype), reps, "quick" if args.quick else
                                   "default", peak, copy)
        torch.cuda.empty_cache()
    # The e2e benchmark's 1.3B layer in bf16 (the rows whose shape is [16384, 2048] and
    # [16384, 8192]): whether the fused path is the faster one where the trainer runs it.
    result["ops_gpt13b"] = bench_ops(torch.bfloat16, reps, "gpt1.3b", peak, copy)
    torch.cuda.empty_cache()
    result["attention"] = bench_attention(reps, args.quick)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    (out / f"kernels_{slug}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"kernels_{slug}.md").write_text(markdown(result))
    print(f"wrote {out / f'kernels_{slug}.json'} and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
