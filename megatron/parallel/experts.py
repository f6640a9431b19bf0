"""The expert grid ("MoE parallel folding", Megatron core): the same ranks as the dense grid,
folded as (pp, edp, ep, etp) instead of (pp, dp, cp, tp). Attention runs over the dense grid;
the experts of a MoE layer are split over the ep ranks, and the ranks holding the same experts
(edp) average their gradients. Expert-tensor parallelism (etp) is 1 in this slice. A stage's
ranks fold in the dense order, tp fastest: stage rank L = dp_cp_rank x tp + tp_rank sits at ep
index L % ep and edp index L // ep, so an ep group takes tensor-parallel ranks first (each of
them routes its own share of the tokens: model/moe/layer.py), then context and data parallel
ones."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Dict, Optional

from megatron.parallel.grid import Grid
from megatron.parallel.state import ParallelState

EXPERT_AXES = ("pp", "edp", "ep", "etp")
EXPERT_GROUPS = (
    ("ep", ("ep",)),  # ranks that split one layer's experts and exchange tokens (all-to-all)
    ("edp", ("edp",)),  # ranks that hold the same experts: their gradients are averaged
)


def expert_grid(state: ParallelState, ep: int) -> Grid:
    """The expert grid over `state`'s ranks: each pipeline stage's dp x cp x tp ranks folded
    into edp x ep (x etp = 1)."""
    per_stage = state.world_size // state.pp
    if per_stage % ep:
        raise ValueError(f"{per_stage} ranks per pipeline stage do not split into "
                         f"expert parallel groups of {ep}")
    sizes = {"pp": state.pp, "edp": per_stage // ep, "ep": ep, "etp": 1}
    return Grid(tuple((axis, sizes[axis]) for axis in EXPERT_AXES), EXPERT_GROUPS)


@dataclass
class ExpertParallel:
    """Where this rank sits on the expert grid and its ep and edp process groups (none when
    ep = 1: every rank holds every expert and nothing is exchanged)."""
    grid: Grid
    rank: int
    groups: Dict[str, object] = field(default_factory=dict)
    # The experts' gradients reduce over groups of their own (edp), not the dense dp_cp group:
    # split over ranks (ep > 1), or tp > 1, whose ranks hold the same experts for other tokens.
    split: bool = False

    @property
    def size(self) -> int:
        return self.grid.sizes["ep"]

    @property
    def index(self) -> int:
        """This rank's index in its ep group: which slice of the experts it holds."""
        return self.grid.index(self.rank, "ep")

    @property
    def ep_group(self):
        return self.groups.get("ep")

    @property
    def edp_group(self):
        return self.groups.get("edp")

    @property
    def edp_size(self) -> int:
        return self.grid.group_size("edp")


def build_expert_parallel(state: ParallelState, ep: int,
                          timeout: Optional[timedelta] = None) -> ExpertParallel:
    """The expert grid and, when the experts reduce over groups of their own (split), its
    groups (collective: every rank calls it alike)."""
    grid = expert_grid(state, ep)
    split = ep > 1 or state.tp > 1
    groups = state.add_grid(grid, timeout) if split else {}
    return ExpertParallel(grid, state.rank, groups, split)
