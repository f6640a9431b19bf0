"""Fitting the model's constants to measured trials, and the checks on the result.

Time: step = theta . features (timing.py) is linear in theta once the GEMM half-saturation
dimension is fixed, so each candidate dimension gets a non-negative least-squares fit on
relative errors, with a ridge pull towards the prior constants so that a term the trials do not
exercise (say attention on the math path only) keeps its prior value. The dimension with the
smallest residual wins. Memory: measured peak = model states + act_scale * activations +
fixed_gb, a two-parameter least-squares fit."""
from __future__ import annotations

import dataclasses
import itertools
import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from megatron.config.errors import InputError
from megatron.planner.layout import Job, Layout
from megatron.planner.memory import GIB, peak_memory
from megatron.planner.profile import Constants, Profile
from megatron.planner.search import SearchSpace, search
from megatron.planner.timing import PLAYER, dot, step_features, theta
from megatron.planner.trials import TrialResult

log = logging.getLogger(__name__)

HALF_DIMS = (4, 8, 16, 32, 48, 64, 96, 128, 192, 256)
# theta index -> how a fitted value becomes a constant
_FROM_THETA = {0: ("gemm_eff", True), 1: ("flash_attn_eff", True), 2: ("hbm_eff", True),
               3: ("comm_eff", True), 4: ("latency_scale", False),
               5: ("microbatch_overhead_s", False), 6: ("step_overhead_s", False),
               7: ("inter_comm_eff", True), 8: ("inter_latency_scale", False),
               9: ("pipe_engine_share", False),
               10: ("pipe_layer_s", False)}


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares by trying every support set (exact; a handful of columns)."""
    n = a.shape[1]
    best, best_res = np.zeros(n), float(b @ b)
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            x, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(x < 0):
                continue
            res = float(np.sum((a[:, cols] @ x - b) ** 2))
            if res < best_res - 1e-15:
                best_res, best = res, np.zeros(n)
                best[list(cols)] = x
    return best


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(v):
        v = np.asarray(v, dtype=float)
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for val in np.unique(v):
            idx = v == val
            r[idx] = r[idx].mean()
        return r
    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return 0.0
    return float(np.corrcoef(rx, ry)[0, 1])


@dataclass
class FitReport:
    constants: Constants
    trials: int
    rel_rmse_before: float
    rel_rmse_after: float
    spearman: float
    rows: List[Dict] = field(default_factory=list)
    memory_fitted: bool = False

    def to_dict(self) -> Dict:
        return {"trials": self.trials, "rel_rmse_before": round(self.rel_rmse_before, 4),
                "rel_rmse_after": round(self.rel_rmse_after, 4),
                "spearman": round(self.spearman, 4), "memory_fitted": self.memory_fitted}


def _rel_rmse(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.sqrt(np.mean(((pred - meas) / meas) ** 2)))


def _fit_theta(feats: np.ndarray, meas: np.ndarray, prior: np.ndarray, ridge: float) -> np.ndarray:
    """theta >= 0 minimising relative squared error + ridge * relative distance to the prior
    (a term the trials barely exercise stays near its prior instead of wandering). The pipeline
    engine's cost per layer is held at the prior: one model's trials cannot tell it from the
    per-micro-batch overhead and the share (its value comes from the published runs)."""
    held = feats[:, PLAYER] * prior[PLAYER]
    a = feats / meas[:, None]
    a[:, PLAYER] = 0.0  # its reg row below then returns the prior exactly
    reg = np.sqrt(ridge) * np.diag(1 / np.where(prior > 0, prior, 1))
    a_aug = np.vstack([a, reg])
    b_aug = np.concatenate([1 - held / meas, np.sqrt(ridge) * (prior > 0).astype(float)])
    return nnls(a_aug, b_aug)


def _constants_from(theta_v: np.ndarray, base: Constants, half: float) -> Constants:
    changes = {"gemm_half_dim": float(half)}
    for i, (name, inverse) in _FROM_THETA.items():
        v = float(theta_v[i])
        if inverse:
            if v > 0:
                changes[name] = 1 / v
        else:
            changes[name] = v
    return dataclasses.replace(base, **changes)


def fit_time(job: Job, prof: Profile, trials: Sequence[TrialResult], ridge: float = 1e-5,
             half_dims: Sequence[float] = HALF_DIMS) -> Tuple[Constants, float]:
    ok = [t for t in trials if t.ok]
    if len(ok) < 3:
        raise InputError(f"calibration needs at least 3 successful trials, found {len(ok)}; "
                         "run more trials (--trials) or check the failed ones in the results file")
    meas = np.array([t.step_time_s for t in ok])
    best: Optional[Tuple[float, Constants]] = None
    for half in half_dims:
        c = prof.constants.replace(gemm_half_dim=float(half))
        p = Profile(prof.spec, c)
        feats = np.array([step_features(job, t.to_layout(), p)[0] for t in ok])
        th = _fit_theta(feats, meas, theta(c), ridge)
        err = _rel_rmse(feats @ th, meas)
        if best is None or err < best[0]:
            best = (err, _constants_from(th, c, half))
    return best[1], best[0]


def fit_memory(job: Job, c: Constants, trials: Sequence[TrialResult]) -> Optional[Constants]:
    """act_scale and fixed_gb from measured peaks; None when the trials carry no memory."""
    ok = [t for t in trials if t.ok and t.mem_gb]
    if len(ok) < 2:
        return None
    rows, y = [], []
    for t in ok:
        lay = t.to_layout()
        bare = peak_memory(job, lay, c.replace(act_scale=0.0, fixed_gb=0.0)).peak_bytes
        full = peak_memory(job, lay, c.replace(act_scale=1.0, fixed_gb=0.0)).peak_bytes
        rows.append([(full - bare) / GIB, 1.0])
        y.append(t.mem_gb - bare / GIB)
    scale, fixed = nnls(np.array(rows), np.array(y))
    return c.replace(act_scale=float(scale) if scale > 0 else c.act_scale, fixed_gb=float(fixed))


def calibrate(job: Job, prof: Profile, trials: Sequence[TrialResult]) -> Tuple[Profile, FitReport]:
    ok = [t for t in trials if t.ok]
    before = np.array([_predict(job, prof, t.to_layout()) for t in ok]) if ok else np.zeros(0)
    consts, err = fit_time(job, prof, trials)
    mem = fit_memory(job, consts, trials)
    consts = mem or consts
    fitted = Profile(prof.spec, consts)
    meas = np.array([t.step_time_s for t in ok])
    after = np.array([_predict(job, fitted, t.to_layout()) for t in ok])
    report = FitReport(consts, len(ok), _rel_rmse(before, meas), err, spearman(after, meas),
                       memory_fitted=mem is not None)
    for t, b, a in zip(ok, before, after):
        report.rows.append({"key": t.key, "measured_s": t.step_time_s, "predicted_before_s": b,
                            "predicted_after_s": a, "mem_gb": t.mem_gb,
                            "predicted_mem_gb": peak_memory(job, t.to_layout(), consts).peak_gb})
    fitted = Profile(prof.spec, consts, {**report.to_dict(), "model": job_note(job)})
    return fitted, report


def _predict(job: Job, prof: Profile, lay: Layout) -> float:
    feats, _ = step_features(job, lay, prof)
    return dot(theta(prof.constants), feats)


def job_note(job: Job) -> str:
    m = job.model
    return (f"L{m.num_layers} h{m.hidden_size} a{m.num_attention_heads} s{m.seq_length} "
            f"gb{job.global_batch} {job.precision}")


def _spread(items: list, count: int) -> list:
    """`count` items evenly spaced over the list, first and last included."""
    if len(items) <= count:
        return list(items)
    if count == 1:
        return items[:1]
    return [items[round(i * (len(items) - 1) / (count - 1))] for i in range(count)]


def calibration_layouts(job: Job, prof: Profile, space: SearchSpace, count: int) -> List[Layout]:
    """`count` fitting layouts that differ in shape: the best of each (TP, PP, micro-batch)
    group first, spread over the predicted ranking so the trials span fast and slow layouts
    (good for the fit and for checking the order); then other layouts to fill the count."""
    ranked = search(job, 1, prof, space).ranked
    if not ranked:
        raise InputError("no candidate layout fits this machine; shrink the model or the batch")
    heads, rest, seen = [], [], set()
    for cand in ranked:
        shape = (cand.layout.tp, cand.layout.pp, cand.layout.micro_batch)
        (rest if shape in seen else heads).append(cand.layout)
        seen.add(shape)
    chosen = _spread(heads, count)
    return chosen + _spread(rest, count - len(chosen)) if len(chosen) < count else chosen
