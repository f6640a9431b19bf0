"""Silent data errors outside the forward pass (resilience.check_state): cheap invariants of the
training state, checked on every rank after every update, so that a bit flipped in a rank's
optimizer state, reduced gradients or weights stops the run in the step it happens, before any
checkpoint holds it.

Two invariants, each a collective that every rank passes at the same step:

- **Adam's moments.** For any gradients g_1..g_t, AdamW's first and second moments
  m = (1-b1) sum b1^(t-i) g_i and v = (1-b2) sum b2^(t-i) g_i^2 satisfy, element by element
  (Cauchy-Schwarz over the two geometric weightings, when b1^2 < b2),

      m^2 <= C v,   C = (1-b1)^2 / ((1-b2) (1 - b1^2/b2))

  (b1 0.9, b2 0.95: C = 1.357). A flip that makes an m large or negative-infinite, or a v small,
  negative or not a number, breaks it: exactly the flips whose update (lr m/(sqrt(v)+eps)) moves a
  weight far. A flip that makes a v larger only slows that weight's learning, and passes. This
  rank's own state is checked: all of it under ZeRO-0, its shard under ZeRO 1-3.
- **Replicas agree.** Where the weights are replicated over the data x context parallel group
  (ZeRO 0-2, experts split over ranks aside), every replica's checksum (the sum of its tensors'
  norms, in float64) must be the same bits: the same reduced gradients through the same kernels
  give the same weights. Under ZeRO-0 this sees a flip in a rank's reduced gradients, its optimizer
  state and its weights (each rank updates its own copy); under ZeRO 1-2 a flip in a rank's copy
  of the weights. The odd one out of three or more replicas is named; two that disagree are both
  named as suspects (which one is wrong is not known), and neither goes into bad_nodes.

A rank that breaks either is named ({"event": "state_suspect"}, its node in bad_nodes when it is
known to be the faulty one), and the run stops with exit 5 before anything of the step is saved;
the job chain resumes from the last checkpoint without that node. Not seen: a flip in a ZeRO 1-3
shard's fp32 weights or reduced gradients (one copy only, and Adam bounds the step such a
gradient takes), and one that makes a second moment larger. The cost is one pass over the
optimizer state and the weights and one small all-gather per step
(benchmarks/trainer/bench_state_check.py)."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from megatron.base import faults
from megatron.base.records import StateSuspectEvent
from megatron.config.errors import BadNode
from megatron.training.sdc import gather_rows

CHUNK = 1 << 22  # elements per temporary of the moment check (16 MiB in fp32)
# On a GPU (256 MiB): a 1.3B model's flat ZeRO state is 20 pieces, not 314, each one product
# and one reduction; the launches, not the bytes, were most of the check's cost there
# (benchmarks/results/gpu_h200.md).
GPU_CHUNK = 1 << 26
REL_TOL = 1e-3   # over rounding: the bound is tight only for adversarial gradient sequences
ABS_TOL = 1e-30  # below this m^2 the update is at most 1e-15 / eps: no weight moves


class StateCorruption(BadNode):
    """A rank's optimizer state or weights broke an invariant after an update (exit 5)."""


def adam_bound(beta1: float, beta2: float) -> Optional[float]:
    """C with m^2 <= C v for every element of AdamW's moments, whatever the gradients; None when
    beta1^2 >= beta2, where no such bound holds."""
    ratio = beta1 * beta1 / beta2
    if ratio >= 1.0:
        return None
    return (1.0 - beta1) ** 2 / ((1.0 - beta2) * (1.0 - ratio))


def _chunks(pairs: Iterable[Tuple[torch.Tensor, torch.Tensor]]):
    """Lists of (m, v) pieces of at most CHUNK (GPU_CHUNK on a GPU) elements together (a flat
    ZeRO shard split)."""
    batch_m, batch_v, size, chunk = [], [], 0, None
    for m, v in pairs:
        if chunk is None:
            chunk = CHUNK if m.device.type == "cpu" else GPU_CHUNK
        n = m.numel()
        # A tensor within a chunk goes in whole, as it is (the check is element by element):
        # splitting each of a ZeRO-0 state's 292 tensors cost more host time than the check
        pieces = (((m, v, n),) if n <= chunk else
                  zip(m.reshape(-1).split(chunk), v.reshape(-1).split(chunk),
                      [min(chunk, n - start) for start in range(0, n, chunk)]))
        for mc, vc, count in pieces:
            if size and size + count > chunk:
                yield batch_m, batch_v
                batch_m, batch_v, size = [], [], 0
            batch_m.append(mc)
            batch_v.append(vc)
            size += count
    if batch_m:
        yield batch_m, batch_v


def _by_betas(optimizer: torch.optim.Optimizer) -> Dict[Tuple[float, float], List[dict]]:
    """Every parameter state of the optimizer, under its group's betas. ZeRO-3 lists a group's
    (flat) parameters only while it steps: where every group has the same betas (as
    engine/optimizer.py builds them) the states are taken from the optimizer's state itself."""
    betas = {tuple(g["betas"]) for g in optimizer.param_groups}
    if len(betas) == 1:
        return {betas.pop(): [s for s in optimizer.state.values() if s]}
    found: Dict[Tuple[float, float], List[dict]] = {}
    for group in optimizer.param_groups:
        states = (optimizer.state.get(p) for p in group["params"])
        found.setdefault(tuple(group["betas"]), []).extend(s for s in states if s)
    return found


def moment_excess(optimizer: torch.optim.Optimizer) -> float:
    """The largest m^2 - C (1 + REL_TOL) v over this rank's AdamW state: at most ABS_TOL when
    healthy; above it (or NaN) when a moment broke the bound. Groups whose betas have no bound are
    left out."""
    worst: List[torch.Tensor] = []
    for betas, states in _by_betas(optimizer).items():
        bound = adam_bound(*betas)
        if bound is None:
            continue
        pairs = [(s["exp_avg"], s["exp_avg_sq"]) for s in states if "exp_avg" in s]
        for ms, vs in _chunks(pairs):
            worst.extend(_excess(ms, vs, bound * (1.0 + REL_TOL)))
    if not worst:
        return -math.inf
    # NaN anywhere stays NaN (torch.max propagates it): the caller treats it as broken
    return float(torch.stack(worst).max())


def _excess(ms: List[torch.Tensor], vs: List[torch.Tensor], limit: float) -> List[torch.Tensor]:
    """max(m^2 - limit v) of each piece (NaN, inf and a negative v included). One piece, as a
    flat ZeRO state gives: v - m^2/limit in one pass and its minimum in another, 16 bytes an
    element. Several small ones: three foreach passes over the batch (24 bytes, 3 launches)."""
    if len(ms) == 1:
        slack = torch.addcmul(vs[0], ms[0], ms[0], value=-1.0 / limit)
        return [slack.min() * -limit]
    sq = torch._foreach_mul(ms, ms)
    torch._foreach_add_(sq, vs, alpha=-limit)
    return list(torch._foreach_max(sq))


def checksum(params: Sequence[torch.Tensor]) -> float:
    """The sum of the tensors' norms in float64: the same bits on replicas holding the same bits."""
    if not params:
        return 0.0
    norms = torch._foreach_norm([p.detach() for p in params])
    return float(torch.stack(norms).double().sum())


@dataclass(frozen=True)
class Finding:
    rank: int
    what: str
    known: bool  # this rank is the faulty one (not one of two replicas that disagree)


def judge(rows: Sequence[Sequence[float]]) -> List[Finding]:
    """Every rank's [moment excess, checksum (NaN: not compared), its replica group's id] in rank
    order -> the ranks that broke an invariant. The same on every rank (all see the same rows)."""
    found: Dict[int, Finding] = {}
    for rank, (excess, _, _) in enumerate(rows):
        if not excess <= ABS_TOL:  # NaN too
            found[rank] = Finding(rank, f"its Adam moments break m^2 <= C v (by {excess:.3g})",
                                  True)
    groups: Dict[float, List[int]] = {}
    for rank, (_, total, group) in enumerate(rows):
        if not math.isnan(group):
            groups.setdefault(group, []).append(rank)
    for members in groups.values():
        sums = [rows[r][1] for r in members]
        counts = Counter(sums)
        if len(counts) <= 1:
            continue
        (common, n), = counts.most_common(1)
        majority = n * 2 > len(members)
        for r in members:
            if rows[r][1] == common and majority:
                continue
            what = (f"its weights' checksum {rows[r][1]!r} differs from its "
                    f"{len(members) - 1} replica(s)'")
            found.setdefault(r, Finding(r, what, majority))
    return [found[r] for r in sorted(found)]


class StateCheck:
    """One run's checker: Engine.train_step calls before_update(step) before the update it
    applies and verify(step) after it."""

    def __init__(self, engine, module: torch.nn.Module, state, zero_stage: int, nodes: List[str],
                 rank: int):
        """engine: the DeepSpeed engine (its optimizer: the inner torch AdamW under ZeRO's
        wrapper); module: the model (its parameters are the replicas compared); state: the
        ParallelState (dp_cp_group: the replicas)."""
        self.engine, self.state, self.nodes, self.rank = engine, state, nodes, rank
        self.replicas = zero_stage <= 2 and state.dp_cp > 1
        # experts split over ranks are replicated over their own group: left out
        self.params = [p for p in module.parameters() if getattr(p, "allreduce", True)]
        ranks = dist.get_process_group_ranks(state.dp_cp_group) if self.replicas else []
        self.group_id = float(min(ranks)) if ranks else math.nan
        self.fault = faults.state_fault(rank)
        self.step, self.findings = 0, []

    @classmethod
    def of(cls, resilience, engine, state, nodes: List[str], rank: int) -> Optional["StateCheck"]:
        """The checker of an engine.engine.Engine when resilience.check_state, else None."""
        if not resilience.check_state:
            return None
        return cls(engine.engine, engine.module, state,
                   engine.ds_config["zero_optimization"]["stage"], nodes, rank)

    def _optimizer(self) -> torch.optim.Optimizer:
        opt = self.engine.optimizer
        return getattr(opt, "optimizer", opt)

    def before_update(self, step: int) -> None:
        """Between the reduction of the step's gradients and its update (ZeRO-0 without
        pipelining): where the test hook bends a reduced gradient."""
        if self.fault and self.fault.step == step and self.fault.target == "grad":
            faults.scale_largest([p.grad for p in self.params if p.grad is not None],
                                 self.fault.factor)

    def verify(self, step: int) -> bool:
        """Collective after the step's update: True when every rank's state holds its
        invariants; False, with self.findings set, when some rank's does not."""
        self.step = step
        if self.fault and self.fault.step == step and self.fault.target != "grad":
            faults.scale_largest(self._targets(self.fault.target), self.fault.factor)
        with torch.no_grad():
            mine = [moment_excess(self._optimizer()),
                    checksum(self.params) if self.replicas else math.nan, self.group_id]
        rows = gather_rows(torch.tensor(mine, dtype=torch.float64), self._device())
        self.findings = judge(rows)
        return not self.findings

    def _device(self) -> torch.device:
        return self.params[0].device if self.params else torch.device("cpu")

    def _targets(self, target: str) -> List[torch.Tensor]:
        if target == "param":
            return [p.data for p in self.params]
        return [s[target] for states in _by_betas(self._optimizer()).values() for s in states
                if target in s]

    def events(self) -> List[StateSuspectEvent]:
        return [StateSuspectEvent(self.step, f.rank, self.nodes[f.rank], f.what, f.known)
                for f in self.findings]

    def bad_nodes(self) -> List[Tuple[str, str]]:
        """(node, reason) of each rank known to be faulty."""
        return [(self.nodes[f.rank], f"rank {f.rank} in step {self.step}: {f.what} "
                                     "(resilience.check_state)") for f in self.findings if f.known]

    def error(self, bad_nodes: str) -> StateCorruption:
        named = "; ".join(f"rank {f.rank} on {self.nodes[f.rank]}: {f.what}"
                          + ("" if f.known else " (one of two replicas that disagree)")
                          for f in self.findings)
        return StateCorruption(
            f"step {self.step}: the training state broke an invariant after the update "
            f"({named}): a silent data error in the optimizer state, the reduced gradients or "
            f"the weights (resilience.check_state). Nothing was saved after it; a rank known to "
            f"be faulty has its node named in {bad_nodes}, which the job chain leaves out of the "
            "next job, and the run resumes from its last checkpoint")

