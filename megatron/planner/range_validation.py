"""How often the published figure falls inside the predicted range (ranges.py), each case
predicted by the fit without its source (validation.leave_one_out's leave-one-source-out
factors): the settings a publication leaves open (its `assumed` micro-batch), the engine's
overlap assumption and the interconnect's efficiency are what the range spans; around it, the
time model's error band, taken for each case from the other sources' held-out errors only
(`source_bands`), so no case's own source informs the band it is checked against."""
from __future__ import annotations

import dataclasses
import statistics
from typing import Dict, List, Sequence, Tuple

import numpy as np

from megatron.planner import ranges
from megatron.planner import validation as v


def held_out_errors(cases: Sequence[v.Case], without: str = "") -> List[float]:
    """Every case's relative error (published / predicted step - 1) under the fit that holds
    out its own source and the source `without` too (nested leave-one-source-out)."""
    out = []
    for src in dict.fromkeys(c.source for c in cases):
        if src == without:
            continue
        factors = v.fit_factors([c for c in cases if c.source not in (src, without)])
        out += [c.published_step_s / v.predict(c, factors) - 1 for c in cases if c.source == src]
    return out


def source_bands(cases: Sequence[v.Case]) -> Dict[str, float]:
    """Per source, the model-error band (ranges.conformal_band) its cases are checked with:
    from the other sources' cases alone, each predicted without its own source and this one."""
    return {src: ranges.conformal_band(held_out_errors(cases, without=src))
            for src in dict.fromkeys(c.source for c in cases)}


def case_range(row: v.Row, model_error: float = 0.0) -> ranges.Range:
    case, factors = row.case, np.array(row.loso_factors)

    def step_s(job, lay, prof) -> float:
        return v.predict(dataclasses.replace(case, job=job, layout=lay, profile=prof), factors)

    return ranges.step_range(case.job, case.layout, case.profile, step_s,
                             free_micro_batch="micro_batch" in case.assumed,
                             model_error=model_error)


def case_ranges(rows: Sequence[v.Row], bands: Dict[str, float] = None
                ) -> List[Tuple[v.Row, ranges.Range]]:
    bands = bands or {}
    return [(r, case_range(r, bands.get(r.case.source, 0.0))) for r in rows
            if r.case.published_step_s]


def coverage(pairs: Sequence[Tuple[v.Row, ranges.Range]]) -> Dict[str, object]:
    """Share of cases whose published step lies in its settings' range and in that range with
    the model's band, the ranges' median and largest relative widths, and how often each
    setting moves the range most."""
    inside = [rng.contains(row.case.published_step_s) for row, rng in pairs]
    in_band = [rng.band_contains(row.case.published_step_s) for row, rng in pairs]
    widths = [rng.width for _, rng in pairs]
    band_widths = [rng.band_width for _, rng in pairs]
    widest: Dict[str, int] = {}
    for _, rng in pairs:
        widest[rng.widest] = widest.get(rng.widest, 0) + 1
    return {"cases": len(pairs), "inside": sum(inside), "coverage": sum(inside) / len(pairs),
            "median_width": statistics.median(widths), "max_width": max(widths),
            "inside_band": sum(in_band), "band_coverage": sum(in_band) / len(pairs),
            "median_band_width": statistics.median(band_widths),
            "max_band_width": max(band_widths),
            "widest": dict(sorted(widest.items()))}
