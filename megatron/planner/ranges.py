"""A predicted range, not only a point: the step time over the settings a prediction rests on
that the user did not fix (docs/planner.md, "Ranges").

Five settings, each varied over the values it can plausibly take, the others at the point:
- micro_batch: when not given, every micro-batch of MICRO_BATCHES that divides the batch per
  replica and fits the device memory (the point keeps the one given or defaulted);
- overlap: the engine's overlap assumption (overlap.py): at one end every gradient reduction
  hidden as far as its backward window allows (Constants.dp_overlap = 1), at the other nothing
  of it hidden (DeepSpeed without overlap_comm; Megatron Core's overlaps off, i.e. megatron-lm);
- interconnect: the links' efficiency +-INTERCONNECT (comm_eff and inter_comm_eff);
- fp8 (jobs with FP8 matrix multiplies only): the FP8 GEMMs' efficiency (fp8_gemm_eff) over
  profile.FP8_GEMM_RANGE, what single published FP8 runs imply (fp8_twins.py);
- moe_balance (mixture-of-experts models only): the busiest expert-parallel rank's routed
  tokens from the mean (a balanced router) to MOE_IMBALANCE times it.
The range is the least and the largest step time over every combination of those values; the
setting that moves it most is the one whose own swing (the others at the point) is widest.

Around it sits the time model's own error: the settings' range widened by MODEL_ERROR each way,
the split-conformal bound of the published cases' leave-one-source-out errors (`conformal_band`:
the ceil((n + 1) COVERAGE)-th smallest |error| of n), so that about COVERAGE of published runs
like those in published.yaml fall inside (range_validation.py measures it with every case's own
source held out of the bound too)."""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence, Tuple

from megatron.config.errors import InputError
from megatron.planner.layout import Job, Layout, layout_problem
from megatron.planner.memory import GIB, peak_memory
from megatron.planner.overlap import DEEPSPEED, OVERLAP
from megatron.planner.profile import FP8_GEMM_FIT, FP8_GEMM_RANGE, Profile

MICRO_BATCHES = (1, 2, 4, 8, 16)
INTERCONNECT = 0.15
SETTINGS = ("micro_batch", "overlap", "interconnect", "fp8", "moe_balance")
# The busiest expert-parallel rank's routed tokens over the mean at the range's far end: 1.25,
# the capacity factor routers are commonly given over a balanced load (Fedus et al. 2021 train
# Switch Transformers at 1.0 and 1.25); the point prices a balanced router (1).
MOE_IMBALANCE = 1.25
COVERAGE = 0.8
# conformal_band of the 69 published cases' leave-one-source-out |errors| (validation.py);
# tests/unit/test_planner_ranges.py recomputes it
MODEL_ERROR = 0.0820
Variant = Tuple[Job, Layout, Profile]
# Presets whose device the published runs behind MODEL_ERROR do not cover, with what is known
# there (docs/planner.md, "Validation" and "FP8"): the band is then an assumption.
DEVICE_EVIDENCE: Dict[str, str] = {
    "mi300x": ("no published run on an MI300-class device is in the validation set behind "
               "this band; this preset's compute is the MI300X's GEMM curve as measured, which "
               "five dense MI325X runs held out of every fit (two sources, four FP8, one bf16) "
               "bear out within 13% (slow on four), where one bf16 MoE (Mixtral 8x7B) took "
               "50% more time than predicted (docs/planner.md, MI300-class devices)"),
    "mi325x": ("no published run on an MI300-class device is in the validation set behind "
               "this band; five dense runs on MI325X held out of every fit (two sources, four "
               "FP8, one bf16) came out within 13% of this preset (slow on four), and one bf16 "
               "MoE (Mixtral 8x7B) took 50% more time than predicted (docs/planner.md, "
               "MI300-class devices)"),
    "frontier": ("the MI250X runs behind this band are the Frontier paper's 175B on 128 GCDs "
                 "and LUMI's on 32-2048 GCDs (all Megatron-DeepSpeed, no flash on LUMI); one "
                 "held out of every fit, Poro 34B at TP 2 x PP 4 x DP 128 on 1024 LUMI GCDs, "
                 "took 29% more time than predicted, outside the band (its figure may average "
                 "the run's saves and restarts; docs/planner.md, Ranges)"),
    "h200": "no published H200 run is in the validation set: the H100 runs' fit is assumed",
    "gh200": ("no published GH200 run is in the validation set (torchtitan's 96 GB H100 runs "
              "are held back): the H100 runs' fit is assumed"),
}


# How far the search's order can be trusted, from the published layout sweeps held out of
# every fit (planner/sweeps.py; docs/planner.md, "A layout sweep held out of every fit");
# tests/unit/test_planner_sweep.py recomputes the figures.
ORDER_EVIDENCE = ("note on the order: on published layout sweeps held out of every fit "
                  "(162 layouts in 15 sweeps: BigScience 2022 on 384 A100s, Hagemann et al. "
                  "2023 on 32-256 A100s) the pick was the measured best or within 1.1% of it "
                  "in 13 of 15, at worst 25% behind it, and 882 of the 1091 pairs measured "
                  "apart beyond the sources' noise were ordered as measured; under nanotron "
                  "(the Ultra-Scale Playbook 2025, 1052 layouts in 22 sweeps on 8-256 H100s) "
                  "within 1.1% in 11 of 22, at worst 294% behind (its multi-node pipelines ran "
                  "2-4 times the priced step), 21826 of the 30676 pairs: layouts a few "
                  "percent apart here are ties (docs/planner.md)")


# What nvidia-smi reported over the predicted allocator peak on the published sweeps' rows
# (least, largest; planner/sweeps.py, docs/planner.md "Memory"); test_planner_sweep.py
# recomputes it.
SMI_OVER_PEAK = (1.19, 1.43)


def smi_note(peak_gib: float, device_gib: float, framework: str) -> str:
    """A line when, under a DeepSpeed engine (where the sweeps ran), the allocator peak at the
    largest ratio nvidia-smi read over it on the published sweeps would not fit the device;
    else empty. Runs of other engines trained at peaks this close (docs/planner.md, Memory)."""
    lo, hi = SMI_OVER_PEAK
    if framework not in DEEPSPEED or peak_gib * hi <= device_gib:
        return ""
    return (f"note on memory: on Megatron-DeepSpeed runs (BigScience 2022) nvidia-smi read "
            f"{lo:.2f}-{hi:.2f}x the allocator peak, {peak_gib * lo:.1f}-{peak_gib * hi:.1f} GB "
            f"here against {device_gib:g} GB: the reserved figure above may be low, and a run "
            "this close to the device may not fit (docs/planner.md, Memory)")


# Near the device's memory the fit verdict is uncertain both ways (docs/planner.md, "Memory";
# tests/unit/test_planner_sweep.py recomputes each figure): of the held-out sweeps' layouts
# those priced at MARGIN of their device or more mostly ran out of memory, yet published runs
# that trained were priced up to MARGIN_HIGH. Outside [MARGIN, MARGIN_HIGH] no line.
MARGIN, MARGIN_HIGH = 0.8, 1.10
MARGIN_EVIDENCE = ("of the 359 layouts of the held-out sweeps (BigScience 2022 under "
                   "Megatron-DeepSpeed, Hagemann et al. 2023 under Aleph Alpha's Scaling, A100 "
                   "80 GB) 24 of the 34 priced at 80-100% of the device ran out of memory (2 of "
                   "the 153 priced lower), yet 24 of the 125 published runs, all of which "
                   "trained, were priced at 80-110% (Llama 3 405B at 103% and 110%)")


MARGIN_FIX = f"search and longest keep this margin with --memory-fraction {MARGIN:g}"


def margin_note(reserved_gib: float, device_gib: float, what: str = "priced",
                fix: str = MARGIN_FIX) -> str:
    """The line for a layout reserved at MARGIN to MARGIN_HIGH of its device, else empty."""
    share = reserved_gib / device_gib
    if not MARGIN <= share <= MARGIN_HIGH:
        return ""
    return (f"note on memory: {what} at {100 * share:.0f}% of the device, where the fit verdict "
            f"is uncertain: {MARGIN_EVIDENCE}; {fix} (docs/planner.md, Memory)")


# Published runs at this many devices or more, and how the planner did on them (docs/planner.md,
# "Ranges"; tests/unit/test_planner_ranges.py recomputes each figure): beyond what the band's
# 80% bound, over runs of every size, says for a layout this large.
SCALE_DEVICES = 4096
SCALE_EVIDENCE = ("at 4096 devices or more: in the fit, Megatron Core's 462B on 6144 H100 and "
                  "Llama 3 405B on 8192-16,384 H100 are priced within 3.3% with their source "
                  "held out; held out of every fit, MegaScale's Megatron-LM baseline (175B on "
                  "8192 and 12,288 A100) took 14.5% and 16.2% more time than predicted, the "
                  "gap growing with the device count (docs/planner.md, Ranges)")


def scale_note(devices: int) -> str:
    """The line beside the band for a layout of SCALE_DEVICES devices or more, else empty."""
    return f"note on scale: {SCALE_EVIDENCE}" if devices >= SCALE_DEVICES else ""


# Engines whose published runs are all held out of every fit, and how the planner did on them
# (docs/planner.md, "Hagemann et al.'s sweeps"; tests/unit/test_planner_sweep.py recomputes
# each figure): the band's width comes from the fitted engines' runs.
ENGINE_EVIDENCE: Dict[str, str] = {
    "aa-scaling": ("no run of this engine is in the fit; on Hagemann et al.'s sweeps (130 "
                   "layouts of Llama 13B-65B on 32-256 A100, held out) its steps took a median "
                   "8% more time than predicted, more the larger the TP (TP 8: 16%), 73 of "
                   "the 130 inside the band, while 82% of the pairs were ordered as measured; "
                   "24 of 192 layouts that ran out of memory were priced to fit "
                   "(docs/planner.md, Hagemann et al.'s sweeps)"),
    "nanotron": ("no run of this engine is in the fit; on the Ultra-Scale Playbook's sweep "
                 "(1052 layouts of Llama-shaped 1B-80B models on 8-256 H100, held out) its "
                 "steps took a median 58% more time than predicted (each sweep's fastest "
                 "layout 15%, the pipelines across nodes 137%), 107 of the 1052 inside the "
                 "band, while 71% of the pairs were ordered as measured; the memory it "
                 "reported was a median 9% under the priced peak (docs/planner.md, The "
                 "Ultra-Scale Playbook's sweep)"),
}


def engine_note(framework: str) -> str:
    """The line beside the band for an engine whose published runs the fit never saw."""
    text = ENGINE_EVIDENCE.get(framework, "")
    return f"note on {framework}: {text}" if text else ""


def device_note(cluster: str) -> str:
    """What the validation says (or does not) about the error band on this preset's device."""
    name = cluster.lower()
    text = DEVICE_EVIDENCE.get("frontier" if name == "mi250x" else name, "")
    return f"note on {cluster}: {text}" if text else ""


@dataclass(frozen=True)
class Range:
    point_s: float
    low_s: float
    high_s: float
    swings: Dict[str, Tuple[float, float]]   # setting -> (least, largest) step, others at point
    model_error: float = 0.0                 # the time model's own error band, a fraction

    @property
    def width(self) -> float:
        """(high - low) / point: the settings' range."""
        return (self.high_s - self.low_s) / self.point_s

    @property
    def band_low_s(self) -> float:
        return self.low_s * (1 - self.model_error)

    @property
    def band_high_s(self) -> float:
        return self.high_s * (1 + self.model_error)

    @property
    def band_width(self) -> float:
        """(band high - band low) / point: the settings' range with the model's error."""
        return (self.band_high_s - self.band_low_s) / self.point_s

    @property
    def widest(self) -> str:
        return max(self.swings, key=lambda k: self.swings[k][1] - self.swings[k][0])

    def contains(self, step_s: float) -> bool:
        """Inside the settings' range."""
        return self.low_s <= step_s <= self.high_s

    def band_contains(self, step_s: float) -> bool:
        """Inside the settings' range widened by the model's error."""
        return self.band_low_s <= step_s <= self.band_high_s

    def describe(self) -> str:
        lo, hi = self.swings[self.widest]
        down, up = self.low_s / self.point_s - 1, self.high_s / self.point_s - 1
        text = (f"range {self.low_s:.3g}-{self.high_s:.3g} s ({100 * down:+.1f}%/{100 * up:+.1f}%)"
                f" over {', '.join(self.swings)}; moved most by {self.widest} "
                f"({lo:.3g}-{hi:.3g} s)")
        if self.model_error:
            text += (f"; with the time model's error (+-{100 * self.model_error:.1f}%, its held-out"
                     f" bound for {100 * COVERAGE:.0f}% of published runs) "
                     f"{self.band_low_s:.3g}-{self.band_high_s:.3g} s")
        return text


def conformal_band(errors: Sequence[float], coverage: float = COVERAGE) -> float:
    """The ceil((n + 1) coverage)-th smallest |error| of n held-out relative errors: a new case
    exchangeable with them lies within it with probability at least `coverage` (split conformal
    prediction); infinite when n is too small for that."""
    ordered = sorted(abs(e) for e in errors)
    k = math.ceil((len(ordered) + 1) * coverage - 1e-9)  # a float product a hair above a whole number
    return ordered[k - 1] if k <= len(ordered) else math.inf


def micro_batch_layouts(job: Job, lay: Layout, prof: Profile) -> List[Layout]:
    """The layout at every micro-batch of MICRO_BATCHES that divides the batch per replica,
    the trainer accepts and fits the device memory; always the layout itself."""
    out = [lay]
    per_replica = job.global_batch // lay.dp
    for mb in MICRO_BATCHES:
        if mb == lay.micro_batch or per_replica % mb:
            continue
        other = dataclasses.replace(lay, micro_batch=mb, grad_accum=per_replica // mb)
        if layout_problem(job, other, prof.spec.framework):
            continue
        try:
            mem = peak_memory(job, other, prof.constants, framework=prof.spec.framework)
        except InputError:
            continue
        if mem.reserved_bytes <= prof.spec.gpu_memory_gb * GIB:
            out.append(other)
    return out


def memory_range(job: Job, lay: Layout, prof: Profile) -> Tuple[float, float, List[int]]:
    """(least, largest) reserved bytes of the busiest stage over the micro-batches that fit
    (micro_batch_layouts), and those micro-batches: what an open micro-batch does to memory."""
    lays = micro_batch_layouts(job, lay, prof)
    reserved = [peak_memory(job, lo, prof.constants, framework=prof.spec.framework)
                .reserved_bytes for lo in lays]
    return min(reserved), max(reserved), sorted(lo.micro_batch for lo in lays)


def overlap_variants(job: Job, prof: Profile) -> List[Tuple[Job, Profile]]:
    """The point, everything hidden the windows allow, and nothing of the reduction hidden;
    the point alone for an engine whose code has no overlap to vary (Overlap.reduce_fixed:
    Aleph Alpha's Scaling all-reduces every gradient after the backward)."""
    if OVERLAP[prof.spec.framework].reduce_fixed:
        return [(job, prof)]
    hidden = dataclasses.replace(prof, constants=prof.constants.replace(dp_overlap=1.0))
    out = [(job, prof), (job, hidden)]
    if prof.spec.framework in DEEPSPEED:
        ds = dict(job.deepspeed)
        ds["zero_optimization"] = {**ds.get("zero_optimization", {}), "overlap_comm": False}
        out.append((dataclasses.replace(job, deepspeed=ds), prof))
    elif prof.spec.framework == "megatron-core":
        spec = dataclasses.replace(prof.spec, framework="megatron-lm")
        out.append((job, dataclasses.replace(prof, spec=spec)))
    return out


def interconnect_profiles(prof: Profile) -> List[Profile]:
    c = prof.constants
    return [prof] + [dataclasses.replace(prof, constants=c.replace(
        comm_eff=c.comm_eff * k, inter_comm_eff=c.inter_comm_eff * k))
        for k in (1 - INTERCONNECT, 1 + INTERCONNECT)]


def _axes(job: Job, lay: Layout, prof: Profile, free_micro_batch: bool) -> Dict[str, list]:
    """Each setting's values as functions of a variant (the point's first)."""
    lays = micro_batch_layouts(job, lay, prof) if free_micro_batch else [lay]
    overlaps = overlap_variants(job, prof)
    links = interconnect_profiles(prof)
    # FP8 jobs: the FP8 GEMMs' efficiency over what single published FP8 runs imply, scaled
    # to the profile's own
    fp8_effs = [prof.constants.fp8_gemm_eff * k / FP8_GEMM_FIT for k in FP8_GEMM_RANGE]
    return {"micro_batch": [lambda v, lo=lo: (v[0], lo, v[2]) for lo in lays],
            "overlap": [lambda v, j=j, p=p: (j, v[1], dataclasses.replace(
                v[2], spec=p.spec, constants=v[2].constants.replace(
                    dp_overlap=p.constants.dp_overlap))) for j, p in overlaps],
            "interconnect": [lambda v, p=p: (v[0], v[1], dataclasses.replace(
                v[2], constants=v[2].constants.replace(comm_eff=p.constants.comm_eff,
                                                       inter_comm_eff=p.constants.inter_comm_eff)))
                             for p in links],
            "fp8": [lambda v: v] + [lambda v, e=e: (v[0], v[1], dataclasses.replace(
                v[2], constants=v[2].constants.replace(fp8_gemm_eff=e))) for e in fp8_effs],
            "moe_balance": [lambda v: v, lambda v: (v[0], v[1], dataclasses.replace(
                v[2], constants=v[2].constants.replace(
                    moe_imbalance=prof.constants.moe_imbalance * MOE_IMBALANCE)))]}


def step_range(job: Job, lay: Layout, prof: Profile, step_s: Callable[[Job, Layout, Profile],
               float], free_micro_batch: bool = False,
               settings: Sequence[str] = SETTINGS, model_error: float = 0.0) -> Range:
    """The Range of step_s(job, layout, profile) over `settings`, with `model_error` the time
    model's own band around it (see the module docstring)."""
    axes = {k: v for k, v in _axes(job, lay, prof, free_micro_batch).items()
            if k in settings and (k != "micro_batch" or free_micro_batch)
            and (k != "overlap" or len(v) > 1)  # one variant: an engine with no overlap
            and (k != "fp8" or job.fp8) and (k != "moe_balance" or job.model.moe.num_experts)}
    point = step_s(job, lay, prof)
    swings = {}
    for name, values in axes.items():
        times = [step_s(*f((job, lay, prof))) for f in values]
        swings[name] = (min(times), max(times))
    every = []
    for combo in itertools.product(*axes.values()):
        v = (job, lay, prof)
        for f in combo:
            v = f(v)
        every.append(step_s(*v))
    return Range(point, min(every), max(every), swings, model_error)
