"""Comparing two runs that do the same arithmetic in two layouts (interleaved or ZB-V against
1F1B, a checkpoint continued on other stages), where every product and every gradient sum runs
in the same order but one reduction cannot: the gradient norm. It is a sum of squares over the
ranks, and another placement of the layers groups its terms otherwise, so the two norms may
differ in the last bit, or not, depending on the values and on the CPU's vector width (equal on
one development machine, an ulp apart on the next). While the norm stays below the clipping
threshold that bit changes nothing; once a step is clipped its coefficient carries the
difference into the weights and the later losses drift by about an ulp a step.

So: the losses must be equal bit for bit up to and including the first step where the two runs
clipped with different norms (that step's loss was computed before its update), and within
DRIFT_BOUND (relative) after it. A wrong gradient, a lost micro-batch or a misplaced layer
moves a loss by 1e-3 or more on these tiny models."""
from __future__ import annotations

from typing import Sequence

DRIFT_BOUND = 1e-5


def first_divergent_clip(ref_norms: Sequence[float], got_norms: Sequence[float],
                         clip: float) -> int:
    """The index of the first step whose norms differ and where either run clipped (DeepSpeed
    scales by clip / (norm + 1e-6) when that is below 1); len(ref_norms) when there is none."""
    for i, (a, b) in enumerate(zip(ref_norms, got_norms)):
        if a != b and max(a, b) + 1e-6 > clip:
            return i
    return len(ref_norms)


def assert_same_arithmetic(what: str, ref_losses, got_losses, ref_norms, got_norms,
                           clip: float, norm_bound: float = 1e-6) -> None:
    assert len(got_losses) == len(ref_losses), (what, got_losses, ref_losses)
    assert len(ref_norms) == len(got_norms) == len(ref_losses), (what, ref_norms, got_norms)
    worst_norm = max(abs(a - b) / abs(b) for a, b in zip(got_norms, ref_norms))
    assert worst_norm <= norm_bound, f"{what}: grad norms {got_norms} vs {ref_norms}"
    k = first_divergent_clip(ref_norms, got_norms, clip)
    assert list(got_losses[:k + 1]) == list(ref_losses[:k + 1]), (
        f"{what}: losses differ before any clipped step's norm did (steps 1-{k + 1} must be "
        f"bit for bit): {got_losses} vs {ref_losses}")
    drift = max((abs(a - b) / abs(b) for a, b in zip(got_losses[k + 1:], ref_losses[k + 1:])),
                default=0.0)
    assert drift <= DRIFT_BOUND, (
        f"{what}: after step {k + 1}, clipped with norms {got_norms[k]!r} vs {ref_norms[k]!r}, "
        f"the losses drift {drift:.1e} > {DRIFT_BOUND:.0e}: {got_losses} vs {ref_losses}")
