"""Calibrated constants of the memory and time models, and the cluster profile that stores them.

A profile is a cluster YAML (hardware.py's fields) plus a `constants` mapping and, when it came
from `megatron-plan calibrate`, a `fitted` record of what it was fitted on. The defaults below
are the uncalibrated starting point. The presets are each device's published curves
(CURVE_CONSTANTS) times the factors fitted to published training runs (PUBLISHED_FIT); the
Frontier preset's compute efficiency is instead set so that the paper's 175B recipe lands near
its published 36% of peak (docs/planner.md)."""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

import yaml

from megatron.base.outputs import write_text_whole
from megatron.config import strict_yaml
from megatron.config.errors import ConfigError, InputError
from megatron.planner.hardware import PRESETS, ClusterSpec, spec_from_dict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Constants:
    # Compute: a GEMM of dims (M, N, K) runs at peak * gemm_eff * prod(d / (d + gemm_half_dim)).
    gemm_eff: float = 0.62
    gemm_half_dim: float = 48.0
    # FP8 GEMMs (Job.fp8, fp8.py) reach this share of the efficiency 16-bit GEMMs of the same
    # shape reach, each against its own peak: 1 prices them as efficient as the 16-bit ones.
    fp8_gemm_eff: float = 1.0
    # Mixture of experts: the routed tokens of the busiest expert-parallel rank over the mean
    # (1: the balanced, dropless router the point prices; experts.layer_delta_features scales
    # that rank's expert GEMMs and its all-to-all by it). planner/ranges.py varies it.
    moe_imbalance: float = 1.0
    # Attention core relative to a GEMM of the same FLOPs: flash kernels vs the math path
    # (which also moves the s x s scores through memory, modelled separately).
    flash_attn_eff: float = 0.55
    # Memory-bound kernels (norms, GeLU, dropout, softmax, Adam) reach this share of HBM.
    hbm_eff: float = 0.7
    # Collectives: the cluster's alpha-beta link fits (hardware.Link), scaled per link class by
    # these calibration factors (1: the fits as published; a fitted profile moves them):
    # bandwidth (comm_eff divides the bus time) and alpha (latency_scale multiplies it) inside
    # a node, and the same two for groups that cross nodes.
    comm_eff: float = 1.0
    latency_scale: float = 1.0
    inter_comm_eff: float = 1.0
    inter_latency_scale: float = 1.0
    # Fixed costs the FLOP and byte counts miss: per micro-batch (kernel launches, pipeline
    # bookkeeping, Python) and per step (optimizer bookkeeping, logging).
    microbatch_overhead_s: float = 2e-3
    step_overhead_s: float = 0.05
    # Share that DeepSpeed's pipeline engine (PP > 1) adds to each micro-batch slot of a stage
    # (the slot's own modelled time times this): what runs of that engine lose against
    # Megatron-LM's own schedule at the same layout, fitted to published runs (validation.py).
    # A share, not seconds per slot: with the other factors at the 48-case fit, the engine's
    # runs (MT-NLG, BLOOM, Frontier, GPT-NeoX) need 6-31% of their slots, where a fixed cost
    # would need 39-188 ms a slot and would make the search trade pipeline stages for fewer,
    # larger micro-batches. 0: none.
    pipe_engine_share: float = 0.0
    # Seconds each layer of a stage adds to each micro-batch slot under DeepSpeed's pipeline
    # engine (PP > 1), on top of the share: a fixed cost per layer call that the runs' FLOPs and
    # bytes miss (its cause is not established), fitted with the share to the published runs of
    # that engine (validation.py). It is what makes their micro-batch 1 slower than 4 at the
    # same layout (docs/planner.md, "The pipeline engine's cost per layer"). 0: none.
    pipe_layer_s: float = 0.0
    # Share of each DP gradient reduction claimed hidden behind the backward at least; the run's
    # overlap_comm claims its own share (zero_settings.overlap_claim), so 0 leaves it to that.
    dp_overlap: float = 0.0
    # Memory: activation formulas times act_scale, plus fixed_gb the allocator sees (BLAS and
    # communication workspaces); the caching allocator reserves (1 + frag) of what is allocated
    # and the runtime holds framework_gb outside it (context, RCCL/NCCL buffers).
    act_scale: float = 1.0
    fixed_gb: float = 0.25
    frag: float = 0.05
    framework_gb: float = 1.0
    # DeepSpeed's contiguous gradient bucket (reduce_bucket_size, elements). None: the run's
    # own, from the training config (megatron/base/deepspeed_json.py, zero_settings.py); a
    # number overrides it, for what-if studies.
    bucket_elems: Optional[float] = None
    # 0: the allocator counts the whole bucket (a GPU's allocated memory). 1: only the pages the
    # gradients touch count (resident memory on a CPU): ZeRO-3 copies every gradient of the
    # stage through it, ZeRO-1/2 move theirs in, so only ZeRO-3 adds min(bucket, parameters).
    bucket_touched: float = 0.0

    def replace(self, **changes) -> "Constants":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> Dict[str, float]:
        return dataclasses.asdict(self)


def shape_curve(dims, half: float) -> float:
    """Share of a GEMM's best rate that dims (M, N, K) reach: prod(d / (d + half)).

    One smooth curve stands for tile and wave quantisation (NVIDIA's Matrix Multiplication
    Background User's Guide, ch. 3): small dimensions leave part of the device idle."""
    out = 1.0
    for d in dims:
        out *= d / (d + half)
    return out


def from_mamf(tflops: float, peak: float, best_shape, half: float = 48.0) -> float:
    """gemm_eff that puts the curve through a published maximum achievable matmul rate
    (MAMF: the fastest of a brute-force search over shapes) at the shape it was found."""
    return tflops / peak / shape_curve(best_shape, half)


# Per device, from public measurements (docs/planner.md, "Per-device efficiencies"): the
# curves alone, before any end-to-end fit. validation.py predicts published runs from these.
# - gemm_eff: Bekman's MAMF table (ml-engineering, compute/accelerator/README.md, BF16):
#   A100 SXM 271.2 TFLOPS at 1024x10240x5120, H100 SXM 794.5 at 2048x2048x13312 ("H200 is
#   the same"), MI300X 781.9 of 1300 at 4096x10240x4864 (ROCm 6.2; 668.4 on a later row).
# - flash_attn_eff: against the full (non-causal) 4 s^2 h FLOPs the planner counts, so twice
#   the share FlashAttention-2 reports for causal attention (Dao 2023: 50-73% of A100 peak);
#   approximate, and a guess on MI300X (the default).
# - hbm_eff: a device copy reaches ~4.3 of 4.8 TB/s on this project's H200 (REFERENCE.md);
#   0.85 leaves room for unfused elementwise kernels (approximate on A100 and H100).
# Frontier's follow the paper (its 175B run at 36.14% of peak, the one end-to-end Frontier
# figure): rocBLAS on its 2023 ROCm reached less than MAMF's 147.0 TFLOPS per GCD (ROCm 6.2).
# Refitted (0.52, 0.45 scaled by 0.925) when issue 26 priced two TP collectives per layer's
# backward and split pipeline sends; test_planner_time holds the recipe at 36.14% within 1%.
CURVE_CONSTANTS: Dict[str, Constants] = {
    "frontier": Constants(gemm_eff=0.481, flash_attn_eff=0.416),
    "mi250x": Constants(gemm_eff=0.481, flash_attn_eff=0.416),
    "a100": Constants(gemm_eff=from_mamf(271.2, 312, (1024, 10240, 5120)), flash_attn_eff=1.0,
                      hbm_eff=0.85),
    "h100": Constants(gemm_eff=from_mamf(794.5, 989, (2048, 2048, 13312)), flash_attn_eff=0.6,
                      hbm_eff=0.85),
    "h200": Constants(gemm_eff=from_mamf(794.5, 989, (2048, 2048, 13312)), flash_attn_eff=0.6,
                      hbm_eff=0.85),
    # hbm_eff: ScalarLM's MI300X memcpy sweep levels off at 2000-3000 of 5300 GB/s above 10 MB
    # (approximate: read one of its plotted curves).
    "mi300x": Constants(gemm_eff=from_mamf(781.9, 1307, (4096, 10240, 4864)), hbm_eff=0.5),
}
# The same chips in other nodes: the 40 GB A100 and GH200's Hopper (one MAMF row each is not
# at hand; the SXM parts' curves stand in, hbm_eff applies to each part's own bandwidth).
CURVE_CONSTANTS["a100-40gb"] = CURVE_CONSTANTS["a100"]
CURVE_CONSTANTS["gh200"] = CURVE_CONSTANTS["h100"]
CURVE_CONSTANTS["mi325x"] = CURVE_CONSTANTS["mi300x"]  # the same chip (its MAMF row: MI300X's)

# The fit of validation.py on all published runs (docs/planner.md, "Validation"): factors on
# the curves' compute (GEMMs and attention), memory-bound and communication seconds, and
# the share DeepSpeed's pipeline engine adds to each slot with the seconds it adds for each
# layer of the slot's stage (communication held at or above the links' line rate:
# validation.lower_bounds). Stored rounded; test_planner_validation.py
# checks that it is what validation.fit_factors gives, so the two cannot drift apart.
PUBLISHED_FIT = {"compute": 1.2833, "memory": 1.1826, "comm": 0.900, "pipe_engine": 0.1175,
                 "pipe_layer": 0.00702}
# fp8_gemm_eff fitted to the FP8 twins of NVIDIA's H100 recipes (fp8_twins.fit_fp8_gemm_eff,
# docs/planner.md "FP8"), on top of PUBLISHED_FIT; stored rounded and checked against the fit
# by tests/unit/test_planner_fp8.py. MI300X takes it too: no MI300X FP8 run with its layout
# was found to check it against.
FP8_GEMM_FIT = 0.8442
# The least and the largest fp8_gemm_eff one twin alone implies (the spread of the runs around
# the fit: the FP8 setting of planner/ranges.py); test_planner_fp8.py recomputes them.
FP8_GEMM_RANGE = (0.779, 0.962)
# Presets that take them: the NVIDIA and MI300X curves are single-device and single-node
# measurements, which end-to-end training does not reach. Frontier keeps its paper calibration,
# an end-to-end figure of its own device (the fit, mostly A100 and H100 runs, puts that run
# within 1% of it from the MAMF curve, one case, which nothing else on MI250X would check).
FITTED_PRESETS = ("a100", "a100-40gb", "h100", "h200", "gh200", "mi300x", "mi325x")
# A preset's own value in place of the fit's where its device's runs say the fit's does not
# carry over (docs/planner.md, "MI300-class devices"). mi300x, mi325x: compute at the MAMF
# curve as measured (1.0, not the fit's x1.2833, which A100 and H100 runs of 2021-2024
# software set).
# Chosen on the three dense MI325X runs of one source (amd_aac25: -2.1%, +1.7%, -9.2% with it,
# 18-27% slow with the fit's) and checked on another's two (amd_perf25, AMD's own figures:
# 8.1% and 12.5% slow with it, 25.8% and 29.6% with the fit's); all five stay out of every
# fit. The one MoE run there (Mixtral 8x7B) goes from 20% to 50% fast: the MoE terms' miss.
DEVICE_FIT: Dict[str, Dict[str, float]] = {"mi300x": {"compute": 1.0},
                                           "mi325x": {"compute": 1.0}}


def preset_fit(name: str) -> Dict[str, float]:
    """The fitted values preset `name` carries: the published runs' fit, with its device's own
    values where DEVICE_FIT holds some."""
    return {**PUBLISHED_FIT, **DEVICE_FIT.get(name, {})}


def apply_fit(c: Constants, fit: Dict[str, float]) -> Constants:
    """The curves' constants with the fitted factors folded in: compute and memory-bound
    seconds times their factor (efficiencies divided by it), both link classes' bandwidth and
    alpha times the communication factor, and the pipeline engine's share of each slot."""
    k = fit["comm"]
    return c.replace(gemm_eff=c.gemm_eff / fit["compute"],
                     flash_attn_eff=c.flash_attn_eff / fit["compute"],
                     hbm_eff=c.hbm_eff / fit["memory"],
                     comm_eff=c.comm_eff / k, latency_scale=c.latency_scale * k,
                     inter_comm_eff=c.inter_comm_eff / k,
                     inter_latency_scale=c.inter_latency_scale * k,
                     pipe_engine_share=fit["pipe_engine"],
                     pipe_layer_s=fit["pipe_layer"])


# What `--cluster PRESET` uses.
PRESET_CONSTANTS: Dict[str, Constants] = {
    name: apply_fit(c, preset_fit(name)).replace(fp8_gemm_eff=FP8_GEMM_FIT)
    if name in FITTED_PRESETS else c for name, c in CURVE_CONSTANTS.items()}
# Constants of earlier versions of the time model, ignored (with a warning) when a profile
# carrying them is loaded: they were fitted to terms that no longer exist.
RETIRED = {"comm_latency_s": "the per-hop latency became per-link alpha-beta fits; refit the "
                             "profile (megatron-plan calibrate --fit-only)",
           "pipe_slot_s": "the pipeline engine's cost became a share of each slot; set "
                          "constants.pipe_engine_share (0: none) or refit the profile "
                          "(megatron-plan calibrate --fit-only)"}


@dataclass(frozen=True)
class Profile:
    spec: ClusterSpec
    constants: Constants = field(default_factory=Constants)
    fitted: Optional[Dict[str, Any]] = None

    def to_yaml(self) -> str:
        out = self.spec.to_dict()
        out["constants"] = self.constants.to_dict()
        if self.fitted:
            out["fitted"] = self.fitted
        return yaml.safe_dump(out, sort_keys=False)

    def save(self, path: str) -> None:
        write_text_whole(path, "the cluster profile", self.to_yaml())


# What a constant may hold beyond "a finite number >= 0": the efficiencies divide a time (0
# divided by zero, features.theta), the shares are read as parts of a whole, and the routing
# imbalance is the busiest expert-parallel rank over the mean.
_ABOVE_ZERO = ("gemm_eff", "fp8_gemm_eff", "flash_attn_eff", "hbm_eff", "comm_eff",
               "inter_comm_eff")
_SHARES = ("dp_overlap", "bucket_touched", "frag")


def _constant_expects(key: str, value: Any) -> Optional[str]:
    """None when `value` suits constants.`key`, else what it expects."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < 0:
        return "a finite number >= 0"
    if key in _ABOVE_ZERO and value == 0:
        return "an efficiency above 0 (it divides a time)"
    if key in _SHARES and value > 1:
        return "a share in [0, 1]"
    if key == "moe_imbalance" and value < 1:
        return "a ratio >= 1 (the busiest expert-parallel rank's routed tokens over the mean)"
    return None


def constants_from_dict(raw: Dict[str, Any], source: str,
                        base: Optional[Constants] = None) -> Constants:
    """The constants a profile's mapping sets; those it leaves out are `base`'s (a derived
    cluster file's preset), or the generic defaults without one."""
    known = {f.name for f in dataclasses.fields(Constants)}
    for key in [k for k in raw if k in RETIRED]:
        log.warning("%s: constants.%s is ignored: %s", source, key, RETIRED[key])
        raw = {k: v for k, v in raw.items() if k != key}
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(f"constants.{key}", value, f"a known constant ({', '.join(sorted(known))})",
                              f"remove or rename it in {source}")
        if value is None and key == "bucket_elems":
            continue
        expects = _constant_expects(key, value)
        if expects:
            raise ConfigError(f"constants.{key}", value, expects, f"fix {source}")
    if raw.get("bucket_elems") is not None:
        # Profiles written before the bucket came from the training config carry 5e8 here.
        log.warning("%s: constants.bucket_elems=%g overrides the run's reduce_bucket_size; "
                    "remove it to use the config's (its deepspeed section or the defaults)",
                    source, raw["bucket_elems"])
    values = {k: None if v is None else float(v) for k, v in raw.items()}
    return (base or Constants()).replace(**values)


def load_profile(name_or_path: str) -> Profile:
    """A preset name (hardware.PRESETS) or a cluster/profile YAML file. A file that names a
    `base` preset is that preset with the fields and constants the file lists changed."""
    if name_or_path.lower() in PRESETS:
        key = name_or_path.lower()
        return Profile(PRESETS[key], PRESET_CONSTANTS.get(key, Constants()))
    try:
        raw = strict_yaml.load_file(name_or_path, "--cluster")
    except FileNotFoundError:
        raise InputError(f"--cluster {name_or_path!r} is neither a preset ({', '.join(sorted(PRESETS))}) "
                         "nor an existing YAML file; pass a preset name or a cluster file "
                         "(see docs/planner.md for its fields)") from None
    except yaml.YAMLError as e:
        raise InputError(f"cluster file {name_or_path!r} is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise InputError(f"cluster file {name_or_path!r} must hold a mapping of cluster fields")
    constants = raw.get("constants") or {}
    if not isinstance(constants, dict):
        raise ConfigError("constants", constants, "a mapping of constant names to numbers",
                          f"fix {name_or_path}")
    if "base" not in raw:
        return Profile(spec_from_dict(raw, name_or_path),
                       constants_from_dict(constants, name_or_path), raw.get("fitted"))
    base = preset_profile(raw["base"], name_or_path)
    fields = {k: v for k, v in raw.items() if k not in ("base", "constants", "fitted")}
    spec = spec_from_dict({**base.spec.to_dict(), **fields}, name_or_path)
    return Profile(spec, constants_from_dict(constants, name_or_path, base.constants),
                   raw.get("fitted"))


def preset_profile(name: Any, source: str) -> Profile:
    """A derived cluster file's `base`: the preset whose fields and constants it starts from."""
    if not isinstance(name, str) or name.lower() not in PRESETS:
        raise ConfigError("base", name, f"a preset ({', '.join(sorted(PRESETS))})",
                          f"fix {source}")
    return load_profile(name)
