"""The rank grid over named axes, outermost first: pp, dp, cp, tp (tensor varies fastest).

rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank, so the TP ranks of one group
are consecutive and land on one node (the paper: TP inside a node, PP across nodes), and the
context-parallel ranks of one sequence sit next to them. With cp folded into the data axis this
is DeepSpeed's PipeModelDataParallelTopology order (axes pipe, data, model): DeepSpeed's
data-parallel group is our dp x cp, which is the group that reduces gradients and partitions
ZeRO state (the ranks of a CP group hold the same parameters). An object passed to layers
explicitly; never a module global."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property
from typing import Dict, List, NamedTuple, Optional, Sequence

import torch.distributed as dist

# The axes in grid order, outermost first; a group is named by the set of axes it spans.
AXES = ("pp", "dp", "cp", "tp")


class RankCoord(NamedTuple):
    """A rank's position as stored (checkpoint shard files name it tp, pp, dp) and passed to
    the engine's and checkpoint's code. dp is the rank's index in the group that reduces
    gradients and partitions ZeRO state: data x context parallel, dp_rank * cp + cp_rank, which
    is the data-parallel rank when cp = 1 (so every earlier checkpoint reads as before). The
    context-parallel degree itself is in the checkpoint's layout record."""
    tp: int
    pp: int
    dp: int


def grid_position(rank: int, sizes: Dict[str, int]) -> Dict[str, int]:
    """A global rank's coordinate along each axis of AXES, for a grid of these sizes."""
    out = {}
    for axis in reversed(AXES):
        n = sizes.get(axis, 1)
        out[axis], rank = rank % n, rank // n
    return out


def position_rank(position: Dict[str, int], sizes: Dict[str, int]) -> int:
    """The global rank at a coordinate (the inverse of grid_position)."""
    rank = 0
    for axis in AXES:
        rank = rank * sizes.get(axis, 1) + position.get(axis, 0)
    return rank


def grid_coords(rank: int, tp: int, dp: int, pp: int, cp: int = 1) -> RankCoord:
    """The stored position of a global rank on a grid of these sizes."""
    at = grid_position(rank, {"pp": pp, "dp": dp, "cp": cp, "tp": tp})
    return RankCoord(tp=at["tp"], pp=at["pp"], dp=at["dp"] * cp + at["cp"])


def grid_rank(tp_rank: int, dp_rank: int, pp_rank: int, tp: int, dp: int, cp_rank: int = 0,
              cp: int = 1) -> int:
    return position_rank({"pp": pp_rank, "dp": dp_rank, "cp": cp_rank, "tp": tp_rank},
                         {"dp": dp, "cp": cp, "tp": tp})


@dataclass
class ParallelState:
    tp: int = 1
    pp: int = 1
    dp: int = 1  # data parallel: replicas that read different samples
    rank: int = 0
    tp_group: Optional[object] = None
    dp_group: Optional[object] = None
    pp_group: Optional[object] = None
    mp_group: Optional[object] = None  # tensor x pipeline: everything one model replica spans
    pp_ranks: List[int] = field(default_factory=lambda: [0])
    # Context parallel (Ulysses): ranks that share samples, each holding 1/cp of the sequence.
    cp: int = 1
    cp_group: Optional[object] = None
    # data x context parallel: gradients are averaged and ZeRO state partitioned over it; the
    # dp group itself when cp = 1 (no second group of the same ranks).
    dp_cp_group: Optional[object] = None

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def sizes(self) -> Dict[str, int]:
        return {"pp": self.pp, "dp": self.dp, "cp": self.cp, "tp": self.tp}

    @cached_property
    def position(self) -> Dict[str, int]:
        """This rank's coordinate along every axis of AXES."""
        return grid_position(self.rank, self.sizes)

    @cached_property
    def coord(self) -> RankCoord:
        return grid_coords(self.rank, self.tp, self.dp, self.pp, self.cp)

    @property
    def tp_rank(self) -> int:
        return self.position["tp"]

    @property
    def dp_rank(self) -> int:
        return self.position["dp"]

    @property
    def cp_rank(self) -> int:
        return self.position["cp"]

    @property
    def pp_rank(self) -> int:
        return self.position["pp"]

    @property
    def dp_cp(self) -> int:
        """Ranks that hold the same parameters: data x context parallel."""
        return self.dp * self.cp

    @property
    def dp_cp_rank(self) -> int:
        return self.coord.dp

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    @classmethod
    def single(cls) -> "ParallelState":
        """A world of one, usable without torch.distributed (references and unit tests)."""
        return cls()

    @classmethod
    def build(cls, tp: int, pp: int, timeout: Optional[timedelta] = None,
              cp: int = 1) -> "ParallelState":
        """Creates every group; all ranks must call it in the same order (collective).
        timeout: for collectives on these groups (torch's new groups do not inherit the world
        group's; parallel.timeout_minutes). cp: parallel.context_parallel_size."""
        world, rank = dist.get_world_size(), dist.get_rank()
        if tp < 1 or pp < 1 or cp < 1 or world % (tp * pp * cp):
            raise ValueError(f"a world of {world} ranks does not split into tensor parallel "
                             f"{tp} x pipeline parallel {pp} x context parallel {cp} x a "
                             "data-parallel size")
        state = cls(tp=tp, pp=pp, dp=world // (tp * pp * cp), rank=rank, cp=cp)
        kwargs = {"timeout": timeout} if timeout is not None else {}

        def mine(axes: Sequence[str]):
            """new_group for every set of ranks that differ only along `axes`; returns (this
            rank's group, its ranks)."""
            found = None
            for ranks in rank_sets(state.sizes, axes):
                group = dist.new_group(ranks, **kwargs)
                if rank in ranks:
                    found = (group, ranks)
            return found

        state.tp_group = mine(["tp"])[0]
        state.dp_group = mine(["dp"])[0]
        state.pp_group, state.pp_ranks = mine(["pp"])
        # With one stage a replica is its tensor-parallel group: no second group of the same ranks.
        state.mp_group = state.tp_group if pp == 1 else mine(["tp", "pp"])[0]
        state.cp_group = mine(["cp"])[0] if cp > 1 else None
        state.dp_cp_group = mine(["dp", "cp"])[0] if cp > 1 else state.dp_group
        return state


def rank_sets(sizes: Dict[str, int], axes: Sequence[str]) -> List[List[int]]:
    """Every list of global ranks that share their coordinates outside `axes` (names of AXES),
    in a fixed order, each list in grid order (outer axes first)."""
    fixed = [a for a in AXES if a not in axes]
    varying = [a for a in AXES if a in axes]
    out = []
    for outer in itertools.product(*(range(sizes.get(a, 1)) for a in fixed)):
        at = dict(zip(fixed, outer))
        ranks = []
        for inner in itertools.product(*(range(sizes.get(a, 1)) for a in varying)):
            at.update(zip(varying, inner))
            ranks.append(position_rank(at, sizes))
        out.append(ranks)
    return out


_LETTERS = {"t": "tp", "d": "dp", "p": "pp", "c": "cp"}


def _rank_sets(tp: int, dp: int, pp: int, axes: str, cp: int = 1) -> List[List[int]]:
    """rank_sets with the axes as letters (t, d, p, c)."""
    return rank_sets({"pp": pp, "dp": dp, "cp": cp, "tp": tp}, [_LETTERS[a] for a in axes])

def set_collective_timeout(seconds: float) -> int:
    """Sets how long a collective of every process group of this process (the world, ours and
    DeepSpeed's) may wait before its backend gives up; the number of groups set. The hang
    watchdog keeps it just above its own limit for the phase, so the watchdog, which says
    where, fires first (training/watchdog.py)."""
    if not dist.is_initialized():
        return 0
    from torch.distributed import distributed_c10d as c10d
    groups = [g for g in list(c10d._world.pg_map) if not c10d._rank_not_in_group(g)]
    for group in groups:
        c10d._set_pg_timeout(timedelta(seconds=seconds), group)
    return len(groups)
