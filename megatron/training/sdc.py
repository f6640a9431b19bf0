"""Silent data errors told apart from loss spikes (resilience.rerun_suspect_steps).

A faulty GPU or HBM can return a wrong result without any error; in the loss it looks exactly
like a spike. With the option on, each step's forward and backward run first and the optimizer
update waits: when the divergence guard would call the step's loss a spike or non-finite, every
rank computes its own micro-batches' losses again on the same weights, with the same random
streams, and compares them with the first result (bitwise: the same kernels on the same inputs
give the same bits). A rank whose losses differ is a suspect: {"event": "sdc_suspect", rank,
host, first, again}, its node goes into <run.dir>/bad_nodes, the step's update is not applied
and the run stops with exit 5 (nothing of it is saved), so the job chain resumes from the last
checkpoint without that node. Identical results on every rank mean a real spike: the update
is applied and the guard's policy (log, stop, rollback) acts as without the option.

What it sees: an error in a rank's forward computation (and so its gradients). Under tensor
parallelism a wrong partial result is all-reduced into the whole TP group, which is named
together. An error that leaves every loss intact and corrupts only the backward pass is not
caught by the recomputation. Off by default: with it on, a step keeps its micro-batches until
the update, and a suspect step costs one more forward pass."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from megatron.checkpoint.layout import rng_state, set_rng_state
from megatron.base.records import SdcSuspectEvent
from megatron.config.errors import BadNode


class SilentDataError(BadNode):
    """A rank's result for a step differed when computed again: the node is suspect (exit 5)."""


@dataclass(frozen=True)
class Suspect:
    rank: int
    first: float
    again: float


class Rerun:
    """One run's checker; for_step(step) is what the engine's train_step receives."""

    def __init__(self, guard, tracker, nodes: List[str], rank: int,
                 environ=os.environ):
        """guard: the DivergenceGuard (its suspicious() judges a loss without counting it);
        tracker: the model's random streams; nodes: every rank's node, by rank."""
        self.guard, self.tracker, self.nodes, self.rank = guard, tracker, nodes, rank
        self.step = 0
        self.suspects: List[Suspect] = []
        self._saved = None
        self._corrupt = _corruption(environ.get("MEGATRON_TEST_CORRUPT"), rank)

    def for_step(self, step: int) -> "Rerun":
        self.step, self.suspects = step, []
        return self

    def begin(self) -> None:
        """Before the step's first forward: the random streams, to compute it again alike."""
        self._saved = rng_state(self.tracker)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self._saved["cuda_all"] = torch.cuda.get_rng_state_all()

    def corrupt(self, loss: torch.Tensor) -> torch.Tensor:
        """The test hook MEGATRON_TEST_CORRUPT=RANK:STEP:FACTOR: that rank's micro-batch losses
        of that step (and so its gradients) are scaled once, as a faulty unit would."""
        if self._corrupt is not None and self._corrupt[0] == self.step:
            return loss * self._corrupt[1]
        return loss

    def judge(self, local: Sequence[torch.Tensor], loss: float,
              again: Callable[[], List[torch.Tensor]]) -> bool:
        """Collective on a suspicious loss (every rank sees the same mean loss): True when the
        update may be applied; False, with self.suspects set, when some rank's losses differed
        when computed again."""
        if not self.guard.suspicious(loss):
            return True
        set_rng_state(self._saved, self.tracker)
        if "cuda_all" in self._saved:
            torch.cuda.set_rng_state_all(self._saved["cuda_all"])
        with torch.no_grad():
            second = again()
        first_t = torch.stack([x.detach().double().reshape(()) for x in local])
        second_t = torch.stack([x.detach().double().reshape(()) for x in second])
        mine = torch.tensor([float(not torch.equal(first_t, second_t)), first_t.sum().item(),
                             second_t.sum().item()], dtype=torch.float64)
        every = gather_rows(mine, local[0].device)
        self.suspects = [Suspect(r, row[1], row[2]) for r, row in enumerate(every) if row[0]]
        return not self.suspects

    def events(self) -> List[SdcSuspectEvent]:
        return [SdcSuspectEvent(self.step, s.rank, self.nodes[s.rank], s.first, s.again)
                for s in self.suspects]

    def bad_nodes(self) -> List[Tuple[str, str]]:
        """(node, reason) of each suspect rank, for <run.dir>/bad_nodes."""
        return [(self.nodes[s.rank], f"rank {s.rank} computed a different loss for the same batch "
                                     f"and weights in step {self.step} "
                                     "(resilience.rerun_suspect_steps)") for s in self.suspects]

    def error(self, bad_nodes: str) -> SilentDataError:
        named = "; ".join(f"rank {s.rank} on {self.nodes[s.rank]}: {s.first!r}, then "
                          f"{s.again!r}" for s in self.suspects)
        return SilentDataError(
            f"step {self.step}: a suspect loss was computed again on the same weights and batch "
            f"and came out different ({named}): a silent data error, not a loss spike "
            f"(resilience.rerun_suspect_steps). The step's update was not applied and nothing "
            f"was saved after it; the node(s) are named in {bad_nodes}, which the job chain "
            "leaves out of the next job, and the run resumes from its last checkpoint")


def gather_rows(mine: torch.Tensor, device: torch.device) -> List[List[float]]:
    """Every rank's `mine` (a small 1-D tensor), in rank order, as lists (a collective)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [mine.tolist()]
    mine = mine.to(device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [t.tolist() for t in every]


def _corruption(value: Optional[str], rank: int):
    if not value:
        return None
    try:
        who, step, factor = value.split(":")
        return (int(step), float(factor)) if int(who) == rank else None
    except ValueError:
        raise ValueError(f"MEGATRON_TEST_CORRUPT={value!r}: expected RANK:STEP:FACTOR, e.g. "
                         "1:12:1000") from None
