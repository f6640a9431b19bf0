"""Where the planner's predicted step goes, and where Megatron-style layouts rank.

For GPT models of 6.7B to 175B on A100 nodes (the preset), under the settings large published
A100 runs used (ZeRO-0 data parallelism, full recompute, the math attention path, micro-batch
1, no sequence parallelism), this reports for each model:

- the TP8 layout with the fewest pipeline stages that fits (tensor parallelism over a whole
  node, the layout Megatron-LM uses for models of this size): its predicted hardware TFLOP/s
  per GPU (recomputed FLOPs counted, as Megatron logs them) and its rank among all fitting
  layouts of the same settings;
- how its step splits: GEMMs, attention, memory-bound kernels, TP collectives (bandwidth and
  latency), pipeline sends, DP reduction + optimizer, bubble;
- the best layout the planner finds.

It measures nothing and compares with no published throughput: it shows how the model's
terms move when the model changes (docs/planner.md, "Published figures"). Results:
benchmarks/results/planner_breakdown.{json,md}.

    .venv/bin/python benchmarks/planner_breakdown.py [--label after] [--cluster a100]"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from megatron.planner import timing  # noqa: E402
from megatron.planner.emit import format_table  # noqa: E402
from megatron.planner.layout import Job  # noqa: E402
from megatron.planner.models import preset_model  # noqa: E402
from megatron.planner.profile import load_profile  # noqa: E402
from megatron.planner.search import SearchSpace, search  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# (model preset, nodes of 8 devices, global batch)
CASES = (("gpt3-6.7b", 16, 512), ("gpt3-13b", 32, 1024), ("22b", 32, 1024),
         ("gpt3-175b", 128, 1536))
SPACE = SearchSpace(micro_batch=(1,), zero=(0,), recompute=("full",), flash=(False,),
                    sequence_parallel=(False,))


def _theta(prof):
    return timing.theta(prof.constants)


def breakdown(job, lay, prof) -> dict:
    """Seconds per step of each term for the slowest stage times the 1F1B slots."""
    feats, parts = timing.step_features(job, lay, prof)
    th = _theta(prof)
    names = timing.FEATURES
    pipe = parts["pipeline"] * th
    out = {name: float(pipe[i]) for i, name in enumerate(names)}
    out["reduce+optimizer"] = float(parts["reduce"] @ th)
    out["step"] = float(feats @ th)
    return out


def run_case(name, nodes, gb, prof) -> dict:
    job = Job(preset_model(name), gb, "bf16")
    result = search(job, nodes, prof, SPACE)
    ranked = result.ranked
    tp8 = [c for c in ranked if c.layout.tp == 8]
    if not tp8:
        return {"model": name, "nodes": nodes, "tp8": None}
    # the TP8 layout with the fewest stages that fits
    ref = min(tp8, key=lambda c: c.layout.pp)
    rank = ranked.index(ref) + 1
    best = ranked[0]
    return {"model": name, "nodes": nodes, "gpus": nodes * prof.spec.gpus_per_node,
            "global_batch": gb, "tp8": ref.layout.key(), "tp8_rank": rank,
            "fitting": len(ranked), "tp8_hw_tflops": ref.time.hw_tflops_per_gpu,
            "tp8_step_s": ref.time.step_s, "best": best.layout.key(),
            "best_hw_tflops": best.time.hw_tflops_per_gpu,
            "terms": breakdown(job, ref.layout, prof)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", default="a100")
    p.add_argument("--label", default="current", help="name of this run in the JSON file")
    args = p.parse_args()
    prof = load_profile(args.cluster)
    rows, terms, cases = [], [], []
    for name, nodes, gb in CASES:
        r = run_case(name, nodes, gb, prof)
        cases.append(r)
        if r["tp8"] is None:
            rows.append([name, str(nodes * 8), "-", "-", "-", "-", "-"])
            continue
        rows.append([name, str(r["gpus"]), r["tp8"], f"{r['tp8_hw_tflops']:.0f}",
                     f"{r['tp8_rank']}/{r['fitting']}", r["best"], f"{r['best_hw_tflops']:.0f}"])
        t = r["terms"]
        share = {k: 100 * v / t["step"] for k, v in t.items() if k != "step"}
        terms.append([name, *(f"{share[k]:.1f}" for k in ("gemm", "attn", "mem", "comm",
                                                             "latency", "microbatch",
                                                             "pipe_engine")),
                      f"{share['reduce+optimizer']:.1f}", f"{t['step']:.3g}"])
    table = format_table(("model", "GPUs", "TP8 layout", "HW TFLOP/s", "rank", "best layout",
                          "best HW TFLOP/s"), rows)
    split = format_table(("model", "GEMM %", "attn %", "mem-bound %", "comm bw %",
                          "comm latency %", "per-mb %", "pipe-slot %", "DP+opt %", "step s"),
                         terms)
    print(table + "\n\n" + split)
    out = os.path.join(HERE, "results", "planner_breakdown.json")
    saved = {}
    if os.path.exists(out):
        with open(out) as f:
            saved = json.load(f)
    saved[args.label] = {"cluster": args.cluster, "cases": cases, "table": table,
                         "split": split}
    with open(out, "w") as f:
        json.dump(saved, f, indent=1, default=lambda v: float(v) if np.isscalar(v) else str(v))
    print(f"\nwrote {out} ({args.label})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
