"""The planner against published runs held out of every fit (published.yaml, held_out).

Most are on AMD MI325X (the MI300X's chip with 256 GB at 6 TB/s), the only MI300-class runs
with their whole layout found. From a user's logs (amd_aac25): three dense FP8 runs (Llama 2
7B and 70B, Llama 3.1 70B) and one bf16 mixture of experts (Mixtral 8x7B at EP 8); from AMD's
own figures as Primus Projection's validation table quotes them (amd_perf25): Llama 3.1 8B in
FP8 and Llama 3.1 70B in bf16. Then a second mixture of experts, on H100 (dgxc_grok): Grok 1
at TP 4 x EP 8, four of NVIDIA's weak-scaling rows and their FP8 twins. Then GLM-130B on 768
A100 40 GB (glm22): TP 4 x PP 8 with lighter end stages under DeepSpeed's pipeline engine, the
speed test of its training notes at two batches; and Poro 34B on 1024 MI250X GCDs of LUMI
(poro24: TP 2 x PP 4 x DP 128 under Megatron-DeepSpeed); and Nemotron-4 15B's batch ramp at
TP 8 on 768-2304 H100 (nemotron24); and MegaScale's Megatron-LM baseline, 175B on 256-12,288
A100 (megascale24). Neither the BF16 fit
of the published cases (profile.PUBLISHED_FIT) nor the FP8 constant (profile.FP8_GEMM_FIT)
saw them. For each:

- presets: the step `megatron-plan --cluster` prices (the MI325X's: the mi325x preset, the
  mi300x one with its memory and bandwidth; the curves with the preset's fit folded in,
  profile.preset_fit, and fp8_gemm_eff);
- all-case fit: the same with the published runs' compute factor too (profile.PUBLISHED_FIT,
  what the preset carried before profile.DEVICE_FIT; chosen on amd_aac25's dense runs);
- curves alone: the device's single-device curves without any fit, at the same fp8_gemm_eff;
- Primus Projection: the error AMD's projection tool published for the same run, where it
  did (projected over measured tokens/s per GPU, minus 1; it benchmarks one node on the GPU);
- the reserved memory the planner predicts beside the device's (all of them ran).

It measures nothing. Results: benchmarks/results/planner_held_out.{json,md}.

    .venv/bin/python benchmarks/planner_held_out.py"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from megatron.planner import ranges, validation  # noqa: E402
from megatron.planner.emit import format_table  # noqa: E402
from megatron.planner.memory import peak_memory  # noqa: E402
from megatron.planner.profile import FP8_GEMM_FIT, PUBLISHED_FIT, Profile  # noqa: E402
from megatron.planner.timing import step_time  # noqa: E402
from planner_results import write_results  # noqa: E402

# Primus Projection's own error on these runs (AMD-AGI/Primus docs/tech_blogs/projection/
# projection.md, commit 24a4fdf: projected 8-node tokens/s per GPU against AMD's measured
# 17,351/16,186, 1,818/1,726 and 1,066/1,174). Its 70B FP8 row is aac-llama31-70b-64-fp8's
# settings (micro-batch 4, FSDP, sequence 8192, 64 MI325X; 1,723 in that run's log).
PRIMUS_PROJECTION = {"amdperf-llama31-8b-64-fp8": 17351 / 16186 - 1,
                     "aac-llama31-70b-64-fp8": 1818 / 1726 - 1,
                     "amdperf-llama31-70b-64-bf16": 1066 / 1174 - 1}


def all_case_fit(case) -> Profile:
    """The preset as the published runs' fit alone makes it (no DEVICE_FIT)."""
    prof = validation.folded_profile(case, [PUBLISHED_FIT[g] for g in validation.GROUPS])
    return Profile(prof.spec, prof.constants.replace(fp8_gemm_eff=FP8_GEMM_FIT))


def row(case) -> dict:
    preset = validation.in_sample_profile(case)
    curves = Profile(case.profile.spec, case.profile.constants.replace(fp8_gemm_eff=FP8_GEMM_FIT))
    step = step_time(case.job, case.layout, preset).step_s
    alone = step_time(case.job, case.layout, curves).step_s
    fitted = step_time(case.job, case.layout, all_case_fit(case)).step_s
    mem = peak_memory(case.job, case.layout, preset.constants, framework=preset.spec.framework)
    # the range `megatron-plan memory` prints for it (the micro-batch is the run's own)
    rng = ranges.step_range(case.job, case.layout, preset,
                            lambda j, lo, p: step_time(j, lo, p).step_s,
                            model_error=ranges.MODEL_ERROR)
    m = case.job.model
    kind = (f"MoE {m.moe.num_experts}x top {m.moe.top_k}" if m.moe.num_experts else "dense")
    return {"case": case.id, "source": case.source, "device": preset.spec.name,
            "layout": case.layout.key(),
            "devices": case.layout.world, "framework": case.framework,
            "precision": "fp8" if case.job.fp8 else case.job.precision, "kind": kind,
            "published_s": case.published_step_s, "presets_s": step,
            "presets_error": case.published_step_s / step - 1, "curves_s": alone,
            "curves_error": case.published_step_s / alone - 1, "all_fit_s": fitted,
            "all_fit_error": case.published_step_s / fitted - 1,
            "primus_error": PRIMUS_PROJECTION.get(case.id),
            "reserved_gib": mem.reserved_gb, "device_gib": preset.spec.gpu_memory_gb,
            "range_s": [rng.low_s, rng.high_s], "band_s": [rng.band_low_s, rng.band_high_s],
            "in_range": rng.low_s <= case.published_step_s <= rng.high_s,
            "in_band": rng.band_low_s <= case.published_step_s <= rng.band_high_s}


def markdown(rows) -> str:
    header = ("run", "layout", "GPUs", "engine", "matmuls", "model", "published s",
              "presets s", "error", "range s", "with the error band", "all-case fit",
              "curves alone", "Primus Projection", "reserved GiB")
    body = [[r["case"], r["layout"], str(r["devices"]), r["framework"], r["precision"],
             r["kind"], f"{r['published_s']:.2f}", f"{r['presets_s']:.2f}",
             f"{100 * r['presets_error']:+.1f}%",
             f"{r['range_s'][0]:.2f}-{r['range_s'][1]:.2f} ({'in' if r['in_range'] else 'out'})",
             f"{r['band_s'][0]:.2f}-{r['band_s'][1]:.2f} ({'in' if r['in_band'] else 'out'})",
             f"{100 * r['all_fit_error']:+.1f}%", f"{100 * r['curves_error']:+.1f}%",
             "-" if r["primus_error"] is None else f"{100 * r['primus_error']:+.1f}%",
             f"{r['reserved_gib']:.0f} of {r['device_gib']:g}"]
            for r in rows]
    return "\n".join([
        "# Runs held out of every fit (MI325X; Grok 1 and Nemotron-4 15B on H100; GLM-130B and "
        "MegaScale's Megatron-LM baseline on A100; Poro 34B on MI250X)", "",
        "Generated by benchmarks/planner_held_out.py (no measurement). published.yaml's held_out "
        "(amd_aac25: a user's Megatron-LM and Primus logs on AMD's Accelerator Cloud, every "
        "argument printed; amd_perf25: AMD's own tokens/s per GPU as Primus Projection's "
        "validation table quotes them, the rest from Primus' recipes), priced as the mi325x "
        "preset (mi300x's with the MI325X's 256 GB and 6 TB/s); dgxc_grok: NVIDIA's Grok 1 benchmark "
        "recipe on DGX H100 (its memory: see docs/planner.md, Mixture of experts); glm22: "
        "GLM-130B's speed test at two batches on 96 DGX-A100 40 GB nodes (the a100-40gb "
        "preset), its layout chosen by measurement; poro24: Poro 34B's training throughput on "
        "1024 GCDs of LUMI (the frontier preset); nemotron24: Nemotron-4 15B's batch ramp at "
        "TP 8 on DGX H100, its engine's overlaps unstated; megascale24: MegaScale's "
        "Megatron-LM baseline, 175B on 256-12,288 A100; mlperf: MLPerf Training v3.0-v5.1's "
        "GPT-3 175B and Llama 3.1 405B and 8B submissions on H100 and H200 (FP8), each "
        "layout the submitter's fastest. presets: "
        "what `megatron-plan --cluster` "
        "prices (the curves with the preset's fit, profile.preset_fit: the published runs' "
        "fit with the MAMF curve's compute as is, and fp8_gemm_eff); all-case fit: the same "
        "with the published runs' compute factor too (x1.2833, the preset before "
        "profile.DEVICE_FIT); curves alone: the device's single-device curves without any fit, "
        "at the same fp8_gemm_eff; Primus Projection: what AMD's projection tool published for "
        "the same run (it benchmarks one node on the GPU, then projects). error: predicted over "
        "published throughput, minus 1 (positive: too fast). range: the settings' range "
        "`megatron-plan memory` prints (planner/ranges.py), then widened by the time model's "
        "error band; in/out: whether the published step lies inside.", "",
        format_table(header, body), ""])


def summary(rows) -> list:
    """One line per kind of run (dense or MoE) and device preset: how many, their median and
    largest |error| under the presets, and how many published steps lie inside the printed
    range and its band."""
    out = []
    groups = dict.fromkeys(("dense" if r["kind"] == "dense" else "MoE", r["device"])
                           for r in rows)
    for kind, device in groups:
        sel = [r for r in rows if r["device"] == device
               and (r["kind"] == "dense") == (kind == "dense")]
        err = np.abs([r["presets_error"] for r in sel])
        out.append(f"{kind} on {device}: {len(sel)} runs, |error| median "
                   f"{100 * np.median(err):.1f}%, max "
                   f"{100 * err.max():.1f}%; inside the range {sum(r['in_range'] for r in sel)}, "
                   f"inside the band {sum(r['in_band'] for r in sel)}")
    # the band is meant to hold 80% of runs like the published ones (ranges.COVERAGE)
    band = sum(r["in_band"] for r in rows)
    out.append(f"all: {len(rows)} runs, {band} inside the band ({100 * band / len(rows):.0f}%; "
               f"its aim, {100 * ranges.COVERAGE:.0f}%), "
               f"{sum(r['in_range'] for r in rows)} inside the range alone")
    return out


def main() -> int:
    rows = [row(case) for case in validation.load_held_out()]
    lines = summary(rows)
    write_results("planner_held_out", {"runs": rows, "summary": lines},
                  markdown(rows) + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
