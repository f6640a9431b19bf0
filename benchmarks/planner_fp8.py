"""The planner's FP8 pricing (megatron/planner/fp8.py) against published FP8 runs.

NVIDIA's DGX Cloud recipes (dgxc-benchmarking v24.11.1) publish every BF16 run of the
validation set's dgxc24 source with an FP8 twin: the same model, layout, batch and scale with
Transformer Engine's FP8 matrix multiplies (published.yaml, fp8_twins). For each twin this
reports the published speedup (the BF16 step over the FP8 step) against the planner's:

- prior: FP8 GEMMs as efficient, against their own peak, as 16-bit GEMMs (fp8_gemm_eff 1);
- shipped: profile.FP8_GEMM_FIT, fitted to all ten twins;
- held out: fitted to the other models' twins only (each model's two scales held out
  together): the honest figure;
and the absolute FP8 step the shipped presets predict, whose error carries the BF16 case's own
(its BF16 twin was in the presets' fit). It measures nothing: no FP8 run is possible here
(this trainer has no FP8, and this machine no GPU). Results: benchmarks/results/planner_fp8.{json,md}.

    .venv/bin/python benchmarks/planner_fp8.py"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from megatron.planner import fp8_twins  # noqa: E402
from megatron.planner.emit import format_table  # noqa: E402
from megatron.planner.profile import FP8_GEMM_FIT  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def rows(twins):
    held_fits = fp8_twins.held_out_fits(twins)
    out = []
    for tw in twins:
        k_held = held_fits[tw.model]
        bf16_s, fp8_s = fp8_twins.predicted_steps(tw, FP8_GEMM_FIT)
        out.append({
            "case": tw.fp8.id, "layout": tw.fp8.layout.key(), "devices": tw.fp8.layout.world,
            "fp8_params": tw.fp8.job.fp8_params,
            "published_bf16_s": tw.bf16.published_step_s,
            "published_fp8_s": tw.fp8.published_step_s,
            "published_speedup": tw.published_speedup,
            "prior_speedup": fp8_twins.predicted_speedup(tw, 1.0),
            "shipped_speedup": bf16_s / fp8_s,
            "held_out_fit": k_held,
            "held_out_speedup": fp8_twins.predicted_speedup(tw, k_held),
            "predicted_bf16_s": bf16_s, "predicted_fp8_s": fp8_s})
    for r in out:
        for key in ("prior", "shipped", "held_out"):
            r[f"{key}_error"] = r[f"{key}_speedup"] / r["published_speedup"] - 1
        # throughput error, as validation.py states it: predicted / published tokens/s - 1
        r["fp8_step_error"] = r["published_fp8_s"] / r["predicted_fp8_s"] - 1
        r["bf16_step_error"] = r["published_bf16_s"] / r["predicted_bf16_s"] - 1
    return out


def run_rows(runs):
    """The FP8 runs without a BF16 twin (MI325X), priced by the presets (their BF16 fit and
    fp8_gemm_eff) and by the curves alone (profile.CURVE_CONSTANTS, no BF16 fit) at the same
    fp8_gemm_eff; none of them is in any fit."""
    from megatron.planner import validation
    from megatron.planner.memory import peak_memory
    from megatron.planner.profile import Profile
    from megatron.planner.timing import step_time
    out = []
    for case in runs:
        preset = validation.in_sample_profile(case)
        curves = Profile(case.profile.spec,
                         case.profile.constants.replace(fp8_gemm_eff=FP8_GEMM_FIT))
        step = step_time(case.job, case.layout, preset).step_s
        step_curves = step_time(case.job, case.layout, curves).step_s
        mem = peak_memory(case.job, case.layout, preset.constants,
                          framework=preset.spec.framework)
        out.append({"case": case.id, "source": case.source, "layout": case.layout.key(),
                    "devices": case.layout.world, "framework": case.framework,
                    "published_s": case.published_step_s, "predicted_s": step,
                    "error": case.published_step_s / step - 1,
                    "curves_s": step_curves,
                    "curves_error": case.published_step_s / step_curves - 1,
                    "reserved_gib": mem.reserved_gb,
                    "device_gib": preset.spec.gpu_memory_gb})
    return out


def summary(table):
    def stats(key):
        e = np.abs([r[key] for r in table])
        return {"median": float(np.median(e)), "max": float(e.max())}
    return {"twins": len(table), "models": len({r["case"].rsplit("-", 2)[0] for r in table}),
            "fit": FP8_GEMM_FIT, **{k: stats(f"{k}_error") for k in
                                    ("prior", "shipped", "held_out", "fp8_step", "bf16_step")}}


def run_markdown(runs) -> str:
    header = ("FP8 run", "layout", "GPUs", "engine", "published s", "presets s", "error",
              "curves alone s", "error", "reserved GiB")
    body = [[r["case"], r["layout"], str(r["devices"]), r["framework"],
             f"{r['published_s']:.2f}", f"{r['predicted_s']:.2f}",
             f"{100 * r['error']:+.1f}%", f"{r['curves_s']:.2f}",
             f"{100 * r['curves_error']:+.1f}%",
             f"{r['reserved_gib']:.0f} of {r['device_gib']:g}"] for r in runs]
    return "\n".join([
        "## FP8 runs on MI325X, held out of every fit", "",
        "published.yaml's fp8_runs (source amd_aac25: a user's Megatron and Primus logs on AMD's "
        "Accelerator Cloud, every argument printed): the mi300x preset with the MI325X's 256 GB "
        "and 6 TB/s. presets: what `megatron-plan --cluster` prices (the curves with the BF16 "
        "fit of the published runs and fp8_gemm_eff); curves alone: the MI300X's single-device "
        "curves without the BF16 fit, at the same fp8_gemm_eff. error: predicted over published "
        "throughput, minus 1.", "",
        format_table(header, body), ""])


def markdown(table, s) -> str:
    def pct(x):
        return f"{100 * x:+.1f}%"
    header = ("FP8 run", "layout", "GPUs", "FP8 weights", "BF16 s", "FP8 s", "speedup",
              "prior", "shipped", "held out (fit)", "error held out", "FP8 s predicted",
              "error")
    body = [[r["case"], r["layout"], str(r["devices"]), "yes" if r["fp8_params"] else "no",
             f"{r['published_bf16_s']:.2f}", f"{r['published_fp8_s']:.2f}",
             f"{r['published_speedup']:.3f}", f"{r['prior_speedup']:.3f}",
             f"{r['shipped_speedup']:.3f}",
             f"{r['held_out_speedup']:.3f} ({r['held_out_fit']:.3f})",
             pct(r["held_out_error"]), f"{r['predicted_fp8_s']:.2f}", pct(r["fp8_step_error"])]
            for r in table]
    return "\n".join([
        "# FP8 twins: the planner's FP8 speedup against published runs", "",
        "Generated by benchmarks/planner_fp8.py (no measurement). Each FP8 run repeats a BF16 "
        "case of the validation set (NVIDIA dgxc-benchmarking v24.11.1, DGX H100) with "
        "Transformer Engine's FP8 and nothing else changed. speedup: published BF16 step / FP8 "
        "step; prior: the planner's with FP8 GEMMs as efficient as 16-bit ones "
        "(fp8_gemm_eff 1); shipped: with profile.FP8_GEMM_FIT "
        f"({FP8_GEMM_FIT}, fitted to all {s['twins']} twins); held out: with the fit to the "
        "other models' twins (each model's two scales held out together); error: predicted "
        "over published speedup, minus 1. FP8 s predicted: the presets' FP8 step (error: "
        "predicted over published throughput, minus 1; it carries the BF16 case's own error, "
        "whose run was in the presets' fit).", "",
        format_table(header, body), "",
        f"{s['twins']} twins, {s['models']} models. |speedup error|: prior median "
        f"{100 * s['prior']['median']:.1f}%, max {100 * s['prior']['max']:.1f}%; shipped "
        f"median {100 * s['shipped']['median']:.1f}%, max {100 * s['shipped']['max']:.1f}%; "
        f"held out median {100 * s['held_out']['median']:.1f}%, max "
        f"{100 * s['held_out']['max']:.1f}%. |FP8 step error| (presets): median "
        f"{100 * s['fp8_step']['median']:.1f}%, max {100 * s['fp8_step']['max']:.1f}% "
        f"(their BF16 twins: median {100 * s['bf16_step']['median']:.1f}%, max "
        f"{100 * s['bf16_step']['max']:.1f}%).", ""])


def main() -> int:
    twins = fp8_twins.load_twins()
    table = rows(twins)
    s = summary(table)
    out = os.path.join(HERE, "results")
    runs = run_rows(fp8_twins.load_runs())
    with open(os.path.join(out, "planner_fp8.json"), "w") as f:
        json.dump({"summary": s, "twins": table, "runs": runs}, f, indent=1)
    text = markdown(table, s) + "\n" + run_markdown(runs)
    with open(os.path.join(out, "planner_fp8.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
