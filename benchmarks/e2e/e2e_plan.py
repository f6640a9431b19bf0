"""The planner's prediction for the benchmark's layout: one device, TP = PP = DP = 1, ZeRO-1, bf16,
no recompute, flash-style attention (SDPA and flash-attn store no s x s scores), what
`megatron-plan memory` computes for that layout (megatron.planner.memory / timing)."""
from __future__ import annotations

import dataclasses
from typing import Optional

from megatron.config.errors import InputError
from megatron.planner.hardware import PRESETS
from megatron.planner.layout import Job, Layout, check_layout
from megatron.planner.memory import peak_memory
from megatron.planner.params import model_params
from megatron.planner.profile import Constants, Profile, load_profile
from megatron.planner.timing import step_time


def preset_for(name: str) -> Optional[str]:
    """The preset whose key the device name contains ('NVIDIA H200' -> 'h200'), longest first."""
    lowered = name.lower().replace(" ", "")
    for key in sorted(PRESETS, key=len, reverse=True):
        if key in lowered and key != "frontier":
            return key
    return None


def profile_for(dev: dict, cluster: Optional[str]):
    """(profile, how it was chosen) or (None, why not)."""
    if cluster:
        return load_profile(cluster), f"--cluster {cluster}"
    if dev["device"] == "cpu":
        from megatron.planner.probe import probe_local
        # A CPU's peak memory is the resident set, which sees only the touched bucket pages.
        return Profile(probe_local(1), Constants(bucket_touched=1.0)), "probe of this CPU"
    key = preset_for(dev["name"])
    if key is None:
        return None, f"no planner preset matches {dev['name']!r}; pass --cluster"
    return load_profile(key), f"preset {key}"


def prediction(model, shape, dev: dict, cluster: Optional[str]) -> dict:
    try:
        prof, source = profile_for(dev, cluster)
    except InputError as exc:
        return {"error": str(exc)}
    if prof is None:
        return {"error": source}
    job = Job(model, shape.global_batch, "bf16")
    lay = Layout(tp=1, pp=1, dp=1, micro_batch=shape.micro_batch,
                 grad_accum=shape.global_batch // shape.micro_batch, zero=1, recompute="none",
                 flash=True)
    check_layout(job, lay)
    mem = peak_memory(job, lay, prof.constants)
    t = step_time(job, lay, prof)
    spec = dataclasses.replace(prof.spec, launcher_env={})
    return {"profile": source, "cluster": spec.to_dict(), "layout": lay.key(),
            "parameters": model_params(model), "peak_mem_gb": mem.peak_gb,
            "reserved_gb": mem.reserved_gb, "states_gb": mem.states_gb,
            "activations_gb": mem.activations / 2 ** 30, "step_time_s": t.step_s,
            "tokens_per_s": t.tokens_per_s, "tflops_per_gpu": t.tflops_per_gpu, "mfu": t.mfu}
