"""Sliding-window attention, and attention within packed documents, on the CPU cores in bands
(model/attention_cores.attention_bands) against the same core attending the whole sequence under
the s x s mask (what both did before): forward and backward of one layer's core, fp32, one
sample, 8 query heads over 2 key/value heads of 64; window 256 (Mistral's 4096 scaled to these
lengths), or documents of 512 tokens packed without a window (data.reset_attention_mask).

Each (core, sequence, path) runs in a fresh process (its peak resident memory is the process's
own), the two paths alternating, each timed over a few steps after one warm-up; the table gives
the fastest step of each and the peak memory above the process's start.

    python benchmarks/attention/bench_band.py            # writes results/attention_band.{json,md}
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
HEADS, GROUPS, DIM, WINDOW, DOCUMENT = 8, 2, 64, 256, 512


def child(core: str, s: int, path: str, steps: int, mask: str) -> dict:
    """One case in this process: the fastest forward + backward and the peak memory added."""
    import torch
    sys.path.insert(0, ROOT)
    from megatron.config import load_config, model_math
    from megatron.model.context import Documents
    from megatron.model import build_model
    from megatron.parallel.state import ParallelState
    torch.set_num_threads(1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if path == "whole":
        model_math.BAND_BLOCK = s  # one block: the s x s mask, as before the bands
    cfg = load_config(os.path.join(ROOT, "examples/local/tiny.yaml"), [
        "model.num_layers=1", f"model.hidden_size={HEADS * DIM}",
        f"model.num_attention_heads={HEADS}", f"model.num_query_groups={GROUPS}",
        f"model.attention_backend={core}", f"model.seq_length={s}",
        f"model.max_position_embeddings={s}"]
        + ([f"model.attention.sliding_window={WINDOW}"] if mask == "window" else []))
    layer = build_model(cfg, ParallelState.single(), 512).layers[0].attention.core
    g = torch.Generator().manual_seed(0)
    q = torch.randn(s, 1, HEADS, DIM, generator=g, requires_grad=True)
    k = torch.randn(s, 1, GROUPS, DIM, generator=g, requires_grad=True)
    v = torch.randn(s, 1, GROUPS, DIM, generator=g, requires_grad=True)
    kwargs = {}
    if mask == "documents":
        tokens = torch.ones(1, s, dtype=torch.long)
        tokens[0, DOCUMENT - 1::DOCUMENT] = 0
        kwargs["documents"] = Documents(eod=0).read(tokens)[0]
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        layer(q, k, v, **kwargs).sum().backward()
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"core": core, "s": s, "path": path, "mask": mask, "step_s": min(times[1:]),
            "peak_mb": (peak - before) / 1024}


def run(core: str, s: int, path: str, steps: int, mask: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", core, str(s), path, str(steps),
                          mask], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", nargs=5, metavar=("CORE", "S", "PATH", "STEPS", "MASK"),
                   help=argparse.SUPPRESS)
    p.add_argument("--lengths", default="2048,4096,8192")
    p.add_argument("--masks", default="window,documents")
    p.add_argument("--cores", default="sdpa,math")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    if args.child:
        core, s, path, steps, mask = args.child
        print(json.dumps(child(core, int(s), path, int(steps), mask)))
        return 0
    rows = []
    for mask in args.masks.split(","):
        for core in args.cores.split(","):
            for s in map(int, args.lengths.split(",")):
                rows.append(compare(core, s, mask, args))
    write(rows, args)
    return 0


def compare(core: str, s: int, mask: str, args) -> dict:
    best = {}
    for r in range(args.rounds):  # the two paths alternate
        for path in (("whole", "band") if r % 2 == 0 else ("band", "whole")):
            got = run(core, s, path, args.steps, mask)
            old = best.get(path)
            best[path] = got if old is None or got["step_s"] < old["step_s"] else old
    print(f"{mask} {core} s={s}: whole {best['whole']['step_s']:.3f} s "
          f"{best['whole']['peak_mb']:.0f} MB, band {best['band']['step_s']:.3f} s "
          f"{best['band']['peak_mb']:.0f} MB", flush=True)
    return {"core": core, "s": s, "mask": mask, "whole": best["whole"], "band": best["band"]}


def write(rows, args) -> None:
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "attention_band.json"), "w") as f:
        json.dump({"window": WINDOW, "document": DOCUMENT, "heads": HEADS, "groups": GROUPS,
                   "dim": DIM, "steps": args.steps, "rounds": args.rounds, "rows": rows}, f,
                  indent=1)
    lines = ["# Attention in bands against the whole masked sequence (CPU): sliding windows "
             "and packed documents", "",
             "Generated by benchmarks/attention/bench_band.py on this machine's CPU (one thread "
             f"a process): one layer's attention core, fp32, one sample, {HEADS} query heads "
             f"over {GROUPS} key/value heads of {DIM}; a sliding window of {WINDOW}, or "
             f"documents of {DOCUMENT} tokens packed (no window); forward and backward, "
             f"the fastest of {args.steps} steps after a warm-up, over {args.rounds} rounds "
             "with the paths alternating, each case in a fresh process; peak memory: the "
             "process's peak resident set above its start (the model, inputs and the "
             "attention's own allocations).", "",
             "| mask | core | sequence | whole s | band s | band / whole | whole MB | band MB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        w, b = r["whole"], r["band"]
        lines.append(f"| {r['mask']} | {r['core']} | {r['s']} | {w['step_s']:.3f} | "
                     f"{b['step_s']:.3f} | "
                     f"{b['step_s'] / w['step_s']:.2f} | {w['peak_mb']:.0f} | "
                     f"{b['peak_mb']:.0f} |")
    with open(os.path.join(RESULTS, "attention_band.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
