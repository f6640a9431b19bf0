"""Where a predicted step goes, and what sets two layouts apart (docs/planner.md, "Where the step
goes").

The step-time model is a sum of features times their weights theta (features.py): the pipeline
(m slots of the slowest stage, and the fill and drain its schedule adds), the gradient
reduction with the optimizer, and a fixed per-step cost. This module reads that sum back as
named terms in seconds per step, so `megatron-plan memory` can print them and `search` can say
why the layout a config sets is behind the best one. The terms add up to the predicted step
exactly; nothing here is priced anew."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from megatron.planner.features import (ATTN, COMM, COMM_X, GEMM, LAT, LAT_X, MB, MEM, PIPE,
                                       PLAYER, dot, theta)
from megatron.planner.jobs import Job
from megatron.planner.layout import Layout
from megatron.planner.profile import Profile
from megatron.planner.timing import step_features

# (name, what it holds, the features it sums) for the busy slots of the slowest stage
SLOT_TERMS: Tuple[Tuple[str, str, Tuple[int, ...]], ...] = (
    ("compute", "GEMMs and attention at the fitted rates", (GEMM, ATTN)),
    ("memory-bound", "norms, activations, softmax, embedding, copies", (MEM,)),
    ("collectives in a node", "TP, CP, expert all-to-all, pipeline sends in a node", (COMM, LAT)),
    ("collectives across nodes", "the same, leaving the node", (COMM_X, LAT_X)),
    ("per micro-batch", "fixed cost of a slot, the pipeline engine's share and per-layer cost",
     (MB, PIPE, PLAYER)),
)
FILL = "pipeline fill and drain"
REDUCE = "gradient reduction + optimizer"
STEP = "per step"
TERMS: Tuple[str, ...] = tuple(t[0] for t in SLOT_TERMS) + (FILL, REDUCE, STEP)
NOTES: Dict[str, str] = {**{t[0]: t[1] for t in SLOT_TERMS},
                         FILL: "idle and partly filled slots the schedule adds",
                         REDUCE: "DP reduction, parameter gathers, the optimizer step",
                         STEP: "fixed cost of a step"}


@dataclass(frozen=True)
class Breakdown:
    seconds: Dict[str, float]   # TERMS, in order, seconds per step
    step_s: float               # their sum: the predicted step

    def share(self, term: str) -> float:
        return self.seconds[term] / self.step_s if self.step_s else 0.0


def step_breakdown(job: Job, lay: Layout, prof: Profile) -> Breakdown:
    """The predicted step of `lay` as TERMS: the slowest stage's m slots split by feature, the
    schedule's fill and drain (what its pipeline time adds to those slots), the reduction and
    optimizer of the stage that reduces the most, the fixed per-step cost."""
    feats, parts = step_features(job, lay, prof)
    th = theta(prof.constants)
    m = lay.pipe.micro_batches
    slots = m * parts["slowest"] * th
    seconds = {name: float(sum(slots[i] for i in idx)) for name, _, idx in SLOT_TERMS}
    seconds[FILL] = dot(th, parts["pipeline"]) - m * dot(th, parts["slowest"])
    seconds[REDUCE] = dot(th, parts["reduce"])
    seconds[STEP] = dot(th, parts["step"])
    return Breakdown(seconds, dot(th, feats))


def table_rows(b: Breakdown) -> List[List[str]]:
    """Rows (term, seconds, share of the step, what it holds) for emit.format_table."""
    return [[t, f"{b.seconds[t]:.4g}", f"{100 * b.share(t):.1f}%", NOTES[t]] for t in TERMS]


HEADER = ("term", "s per step", "share", "holds")


def differences(slow: Breakdown, fast: Breakdown) -> List[Tuple[str, float]]:
    """(term, seconds slow - fast) for every term, largest gap first."""
    return sorted(((t, slow.seconds[t] - fast.seconds[t]) for t in TERMS),
                  key=lambda d: -abs(d[1]))


def explain_gap(slow: Breakdown, fast: Breakdown, terms: int = 3) -> str:
    """'+4.1 s collectives in a node, -1.2 s pipeline fill and drain, ...': the terms that move
    the most between the two layouts (positive: the slower one spends more)."""
    shown: Sequence[Tuple[str, float]] = differences(slow, fast)[:terms]
    return ", ".join(f"{d:+.3g} s {t}" for t, d in shown)
