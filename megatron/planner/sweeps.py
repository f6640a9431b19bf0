"""Published layout sweeps: one model on one machine, measured at many layouts, held out of
every fit (published.yaml, `sweeps`; benchmarks/planner_sweep.py).

A sweep tests what `megatron-plan search` is for: putting layouts in order. Each row is a
layout the source ran, with its seconds per step and the memory it reported, or that it ran
out of memory. Rows are priced with the presets (validation.in_sample_profile: the curves with
the all-case fit, which never saw a sweep) and compared:

- order: Spearman's rank correlation between predicted and measured throughput; of the pairs
  whose measured throughputs differ by more than `min_gap` (the source's repeat noise), the
  share the planner orders the same way; where the measured best falls in the predicted order,
  and where the predicted best falls in the measured one;
- memory: predicted reserved memory against the reported one, and whether each row that ran
  out of memory is predicted not to fit (and each that ran, to fit);
- the range: whether each measured step lies inside the range `megatron-plan memory` prints
  for the row, widened by the model's error band (planner/ranges.py).

Throughput is tokens per second per device, so that rows of different global batch compare."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from megatron.config.errors import InputError
from megatron.planner import ranges
from megatron.planner.layout import engine_stage_counts
from megatron.planner.memory import GIB, peak_memory
from megatron.planner.timing import step_time
from megatron.planner.validation import (Case, case_from_entry, in_sample_profile,
                                         load_published)

ROW_KEYS = ("tp", "pp", "micro_batch", "batch", "step_s", "tokens_per_s", "mem_gb", "oom", "cp",
            "interleave", "sp", "zero")


@dataclass(frozen=True)
class SweepRow:
    case: Case
    mem_gb: Optional[float]   # what the source reported (its own unit: nvidia-smi's GiB)
    oom: bool                 # the source ran out of memory: no step time


@dataclass(frozen=True)
class Sweep:
    name: str
    source: str
    what: str
    min_gap: float            # measured differences below this are the source's noise
    rows: Tuple[SweepRow, ...]
    # whether the source lists the layouts that ran out of memory (the memory verdict's
    # evidence, ranges.MARGIN_EVIDENCE, counts only such sweeps)
    lists_oom: bool = True


def build_sweep(raw: Dict, defaults: Dict) -> Sweep:
    """A sweep from its published.yaml entry: `common` fields shared by every row, `rows` the
    layouts (tp, pp, micro_batch, batch, optionally sp and zero; step_s or tokens_per_s (per
    device) and mem_gb as reported, or oom: true)."""
    name = raw["name"]
    rows, seen = [], {}
    for i, r in enumerate(raw["rows"]):
        unknown = sorted(set(r) - set(ROW_KEYS))
        if unknown:
            raise InputError(f"sweep {name} row {i}: unknown field {unknown[0]!r} (expected "
                             f"one of {', '.join(ROW_KEYS)})")
        oom = bool(r.get("oom", False))
        if oom == ("step_s" in r or "tokens_per_s" in r):
            raise InputError(f"sweep {name} row {i}: give step_s (or tokens_per_s) for a row "
                             "that ran, or oom: true for one that ran out of memory (not both)")
        fields = {k: v for k, v in r.items() if k not in ("mem_gb", "oom")}
        sp = "-sp" if r.get("sp", raw["common"].get("sp")) else ""
        zero = f"-z{r['zero']}" if "zero" in r else ""
        rid = f"{name}-tp{r['tp']}-pp{r['pp']}-mb{r['micro_batch']}{sp}{zero}"
        if rid in seen:
            at_zero = f" and ZeRO-{r['zero']}" if zero else ""
            raise InputError(f"sweep {name} row {i}: TP {r['tp']} x PP {r['pp']} at "
                             f"micro-batch {r['micro_batch']}{' with SP' if sp else ''}"
                             f"{at_zero} is row "
                             f"{seen[rid]} already; keep one measurement of a layout (the "
                             "source's repeats set min_gap)")
        seen[rid] = i
        entry = {**raw["common"], **fields, "id": rid, "source": raw["source"]}
        rows.append(SweepRow(case_from_entry(entry, defaults), r.get("mem_gb"), oom))
    return Sweep(name, raw["source"], raw["what"], float(raw["min_gap"]), tuple(rows),
                 bool(raw.get("lists_oom", True)))


# Sources whose sweeps searched for the fastest layout, so that each sweep's measured best is a
# layout chosen by measurement (Hagemann et al.: the most efficient configuration found for
# each model, sequence and device count is its sweep's fastest row); it counts among the
# layouts chosen for speed (validation.CHOSEN_FOR_SPEED; held out of every fit); so is each
# of the Ultra-Scale Playbook's (usp25), a brute-force sweep of each model and GPU count.
# BigScience's sweeps chose BLOOM's layout, which the fitted case bloom-176b already counts.
CHOSEN_BY_SWEEP = ("hagemann23", "usp25")
# Sources whose mem_gb is what nvidia-smi read (ranges.SMI_OVER_PEAK); the others' is their
# own counter (the Ultra-Scale Playbook does not say which).
SMI_SOURCES = ("bigscience22",)


def tokens_per_device_s(case: Case, step_s: float) -> float:
    """The case's throughput per device at step_s seconds a step (rows of different global
    batch compare by it)."""
    return case.job.global_batch * case.job.model.seq_length / step_s / case.layout.world


def measured_best(sweep: Sweep) -> Case:
    """The sweep's fastest row that ran, by tokens per second per device."""
    ran = [r.case for r in sweep.rows if not r.oom]
    return max(ran, key=lambda c: tokens_per_device_s(c, c.published_step_s))


def reframed(case: Case, framework: str) -> Case:
    """The case as the engine `framework` would run it (its overlap, model states, costs, and
    its stage split: an engine's own by cost, Overlap.cost_split, else the even one)."""
    spec = dataclasses.replace(case.profile.spec, framework=framework)
    lay = dataclasses.replace(case.layout, stage_counts=engine_stage_counts(
        case.job.model, case.layout.pp, framework))
    return dataclasses.replace(case, framework=framework, layout=lay,
                               profile=dataclasses.replace(case.profile, spec=spec))


def as_engine(sweep: Sweep, framework: str) -> Sweep:
    """The sweep with every row priced as the engine `framework`: how far a result rests on
    the engine the rows were given."""
    return dataclasses.replace(sweep, rows=tuple(
        dataclasses.replace(r, case=reframed(r.case, framework)) for r in sweep.rows))


def load_sweeps(path: Optional[str] = None) -> List[Sweep]:
    pub = load_published(path) if path else load_published()
    return [build_sweep(raw, pub.defaults) for raw in pub.sweeps]


def ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties sharing their mean rank."""
    v = np.asarray(values, dtype=float)
    order = np.argsort(v, kind="stable")
    out = np.empty(len(v))
    i = 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
            j += 1
        out[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's on the ranks."""
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(np.sqrt((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / den) if den else 0.0


def pairs_agreeing(measured: Sequence[float], predicted: Sequence[float],
                   min_gap: float) -> Tuple[int, int]:
    """(agreeing, counted): of the pairs whose measured values differ by more than min_gap
    (relative to the smaller), how many the predicted values order the same way."""
    agree = total = 0
    for i in range(len(measured)):
        for j in range(i + 1, len(measured)):
            lo, hi = sorted((measured[i], measured[j]))
            if hi / lo - 1 <= min_gap:
                continue
            total += 1
            agree += (measured[i] - measured[j]) * (predicted[i] - predicted[j]) > 0
    return agree, total


@dataclass(frozen=True)
class RowResult:
    row: SweepRow
    predicted_s: float
    reserved_gib: float
    fits: bool
    band_s: Tuple[float, float] = (0.0, 0.0)   # the printed range with the error band
    peak_gib: float = 0.0                      # the allocator peak (reserved is above it)

    @property
    def in_band(self) -> bool:
        s = self.row.case.published_step_s
        return s is not None and self.band_s[0] <= s <= self.band_s[1]

    @property
    def error(self) -> Optional[float]:
        """Predicted over measured throughput, minus 1 (positive: the planner is too fast)."""
        s = self.row.case.published_step_s
        return None if s is None else s / self.predicted_s - 1

    def tokens_per_device_s(self, step_s: float) -> float:
        return tokens_per_device_s(self.row.case, step_s)


def price(row: SweepRow) -> RowResult:
    prof = in_sample_profile(row.case)
    c = row.case
    step = step_time(c.job, c.layout, prof).step_s
    mem = peak_memory(c.job, c.layout, prof.constants, framework=prof.spec.framework)
    rng = ranges.step_range(c.job, c.layout, prof, lambda j, lo, p: step_time(j, lo, p).step_s,
                            model_error=ranges.MODEL_ERROR)
    return RowResult(row, step, mem.reserved_gb,
                     mem.reserved_bytes <= prof.spec.gpu_memory_gb * GIB,
                     (rng.band_low_s, rng.band_high_s), mem.peak_gb)


def _abs_errors(ran: Sequence[RowResult]) -> List[float]:
    return [abs(r.error) for r in ran]


def _memory_errors(results: Sequence[RowResult]) -> List[float]:
    """Predicted reserved over reported memory, minus 1, for the rows that report it."""
    return [r.reserved_gib / r.row.mem_gb - 1 for r in results if r.row.mem_gb]


def order_stats(results: Sequence[RowResult], min_gap: float) -> Dict[str, float]:
    """How the predicted order of the rows that ran matches the measured one."""
    ran = [r for r in results if not r.row.oom]
    meas = [r.tokens_per_device_s(r.row.case.published_step_s) for r in ran]
    pred = [r.tokens_per_device_s(r.predicted_s) for r in ran]
    agree, counted = pairs_agreeing(meas, pred, min_gap)
    best_m, best_p = int(np.argmax(meas)), int(np.argmax(pred))
    return {"rows": len(ran), "median_abs_error": float(np.median(_abs_errors(ran))),
            "spearman": spearman(meas, pred), "pairs_agreeing": agree,
            "pairs_counted": counted,
            # 1-based: the measured best's place in the predicted order, and the reverse
            "measured_best_predicted_rank": int((np.asarray(pred) > pred[best_m]).sum()) + 1,
            "in_band": sum(r.in_band for r in ran),
            "predicted_best_measured_rank": int((np.asarray(meas) > meas[best_p]).sum()) + 1,
            "predicted_best_behind": meas[best_m] / meas[best_p] - 1}


def memory_stats(results: Sequence[RowResult]) -> Dict[str, float]:
    """Predicted reserved memory against the reported, and out-of-memory agreement."""
    errs = _memory_errors(results)
    return {"rows": len(errs), "median_error": float(np.median(errs)) if errs else 0.0,
            "max_under": float(min(errs, default=0.0)),
            "oom_rows": sum(r.row.oom for r in results),
            "oom_predicted": sum(r.row.oom and not r.fits for r in results),
            "ran_predicted_to_fit": sum(not r.row.oom and r.fits for r in results),
            "ran": sum(not r.row.oom for r in results)}


def evaluate(sweep: Sweep) -> Tuple[List[RowResult], Dict[str, float], Dict[str, float]]:
    results = [price(r) for r in sweep.rows]
    return results, order_stats(results, sweep.min_gap), memory_stats(results)


def pooled(evaluated: Sequence[Tuple[List[RowResult], Dict[str, float], Dict[str, float]]]
           ) -> Dict[str, float]:
    """Every sweep together: rows, pairs (each within its own sweep: rows of different models
    do not order) and memory pooled."""
    rows = [r for results, _, _ in evaluated for r in results]
    ran = [r for r in rows if not r.row.oom]
    mem = _memory_errors(rows)
    return {"sweeps": len(evaluated), "rows": len(ran),
            "median_abs_error": float(np.median(_abs_errors(ran))),
            "in_band": sum(r.in_band for r in ran),
            "pairs_agreeing": sum(o["pairs_agreeing"] for _, o, _ in evaluated),
            "pairs_counted": sum(o["pairs_counted"] for _, o, _ in evaluated),
            "memory_rows": len(mem),
            "memory_median_error": float(np.median(mem)) if mem else None,
            "oom_rows": sum(r.row.oom for r in rows),
            "oom_predicted": sum(r.row.oom and not r.fits for r in rows),
            "ran": len(ran), "ran_predicted_to_fit": sum(r.fits for r in ran)}
