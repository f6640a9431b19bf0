"""The FP8 pricing (fp8.py) against published FP8 runs that repeat a BF16 case of
published.yaml with FP8 matrix multiplies and nothing else changed (its `fp8_twins`).

A twin isolates what FP8 changes: its published speedup (the BF16 run's step over the FP8
run's) is compared with the planner's, so the BF16 case's own error cancels. One constant is
fitted to the twins, profile.Constants.fp8_gemm_eff (the share of the 16-bit GEMMs' efficiency
FP8 GEMMs reach), by least squares on the log of the speedups; held out, each model's twins
are priced by the fit to the other models' (fit_fp8_gemm_eff, held_out_speedups). The BF16
fit (validation.py, profile.PUBLISHED_FIT) never sees an FP8 run."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Dict, List, Sequence

from megatron.config.errors import InputError
from megatron.planner import validation
from megatron.planner.profile import Profile
from megatron.planner.timing import step_time

# the range the fit searches, and its tolerance on the constant
SEARCH = (0.2, 1.5)
TOLERANCE = 1e-5


@dataclass(frozen=True)
class Twin:
    fp8: validation.Case    # the BF16 case with Job.fp8 (and fp8_params) and its own step
    bf16: validation.Case

    @property
    def published_speedup(self) -> float:
        return self.bf16.published_step_s / self.fp8.published_step_s

    @property
    def model(self) -> str:
        """The twins of one recipe at other scales share this (the case id without its
        device count): held out together."""
        return self.bf16.id.rsplit("-", 1)[0]


def load_twins(path: str = validation.DATA) -> List[Twin]:
    published = validation.load_published(path)
    cases = published.by_id()
    out = []
    for entry in published.fp8_twins:
        base = cases.get(entry["twin"])
        if base is None or base.published_step_s is None:
            raise InputError(f"{path}: FP8 twin {entry['id']} names {entry['twin']!r}, which "
                             "is not a case with a published figure")
        job = dataclasses.replace(base.job, fp8=True,
                                  fp8_params=bool(entry.get("fp8_params", False)))
        fp8_case = dataclasses.replace(base, id=entry["id"], job=job,
                                       published_step_s=float(entry["step_s"]),
                                       published={"step_s": float(entry["step_s"])})
        out.append(Twin(fp8_case, base))
    return out


def profile(case: validation.Case, fp8_gemm_eff: float) -> Profile:
    """The case's preset (what `megatron-plan --cluster PRESET` prices it with) at
    fp8_gemm_eff."""
    prof = validation.in_sample_profile(case)
    return Profile(prof.spec, prof.constants.replace(fp8_gemm_eff=fp8_gemm_eff))


def predicted_steps(tw: Twin, fp8_gemm_eff: float) -> tuple:
    """(BF16 step, FP8 step) the planner predicts for the twin's two runs."""
    prof = profile(tw.bf16, fp8_gemm_eff)
    return (step_time(tw.bf16.job, tw.bf16.layout, prof).step_s,
            step_time(tw.fp8.job, tw.fp8.layout, prof).step_s)


def predicted_speedup(tw: Twin, fp8_gemm_eff: float) -> float:
    bf16, fp8 = predicted_steps(tw, fp8_gemm_eff)
    return bf16 / fp8


def _loss(twins: Sequence[Twin], k: float) -> float:
    return sum(math.log(predicted_speedup(tw, k) / tw.published_speedup) ** 2 for tw in twins)


def fit_fp8_gemm_eff(twins: Sequence[Twin]) -> float:
    """fp8_gemm_eff minimising the squared log error of the twins' speedups (golden-section
    search over SEARCH: the loss is unimodal in it, the FP8 GEMM seconds being monotone)."""
    if not twins:
        raise InputError("no FP8 twins to fit fp8_gemm_eff to")
    lo, hi = SEARCH
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = _loss(twins, a), _loss(twins, b)
    while hi - lo > TOLERANCE:
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = _loss(twins, a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = _loss(twins, b)
    return (lo + hi) / 2


def held_out_fits(twins: Sequence[Twin]) -> Dict[str, float]:
    """Per model: fp8_gemm_eff fitted to the other models' twins."""
    models = list(dict.fromkeys(tw.model for tw in twins))
    return {m: fit_fp8_gemm_eff([tw for tw in twins if tw.model != m]) for m in models}


def held_out_speedups(twins: Sequence[Twin]) -> Dict[str, float]:
    """Each twin's predicted speedup under the fit to the other models' twins."""
    fits = held_out_fits(twins)
    return {tw.fp8.id: predicted_speedup(tw, fits[tw.model]) for tw in twins}
