"""How often the published figure falls inside the predicted range (ranges.py), each case
predicted by the fit without its source (validation.leave_one_out's leave-one-source-out
factors): the settings a publication leaves open (its `assumed` micro-batch), the engine's
overlap assumption and the interconnect's efficiency are what the range spans."""
from __future__ import annotations

import dataclasses
import statistics
from typing import Dict, List, Sequence, Tuple

import numpy as np

from megatron.planner import ranges
from megatron.planner import validation as v


def case_range(row: v.Row) -> ranges.Range:
    case, factors = row.case, np.array(row.loso_factors)

    def step_s(job, lay, prof) -> float:
        return v.predict(dataclasses.replace(case, job=job, layout=lay, profile=prof), factors)

    return ranges.step_range(case.job, case.layout, case.profile, step_s,
                             free_micro_batch="micro_batch" in case.assumed)


def case_ranges(rows: Sequence[v.Row]) -> List[Tuple[v.Row, ranges.Range]]:
    return [(r, case_range(r)) for r in rows if r.case.published_step_s]


def coverage(pairs: Sequence[Tuple[v.Row, ranges.Range]]) -> Dict[str, object]:
    """Share of cases whose published step lies in its range, the ranges' median and largest
    relative width, and how often each setting moves the range most."""
    inside = [rng.contains(row.case.published_step_s) for row, rng in pairs]
    widths = [rng.width for _, rng in pairs]
    widest: Dict[str, int] = {}
    for _, rng in pairs:
        widest[rng.widest] = widest.get(rng.widest, 0) + 1
    return {"cases": len(pairs), "inside": sum(inside), "coverage": sum(inside) / len(pairs),
            "median_width": statistics.median(widths), "max_width": max(widths),
            "widest": dict(sorted(widest.items()))}
