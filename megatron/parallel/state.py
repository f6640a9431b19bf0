"""The rank grid: tensor parallel varies fastest, then data, then pipeline.

rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank, so the TP ranks of one group are
consecutive and land on one node (the paper: TP inside a node, PP across nodes). This is also
DeepSpeed's PipeModelDataParallelTopology order (axes pipe, data, model), so our groups and the
pipeline engine's agree. An object passed to layers explicitly; never a module global."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property
from typing import List, NamedTuple, Optional

import torch.distributed as dist


class RankCoord(NamedTuple):
    """A rank's position on the grid, one coordinate per parallel axis. The one order used
    wherever a position is stored or passed (checkpoint shard files name it tp, pp, dp)."""
    tp: int
    pp: int
    dp: int


def grid_coords(rank: int, tp: int, dp: int, pp: int) -> RankCoord:
    """The position of a global rank on a grid of these sizes."""
    return RankCoord(tp=rank % tp, pp=rank // (tp * dp), dp=(rank // tp) % dp)


def grid_rank(tp_rank: int, dp_rank: int, pp_rank: int, tp: int, dp: int) -> int:
    return pp_rank * (dp * tp) + dp_rank * tp + tp_rank


@dataclass
class ParallelState:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    rank: int = 0
    tp_group: Optional[object] = None
    dp_group: Optional[object] = None
    pp_group: Optional[object] = None
    mp_group: Optional[object] = None  # tensor x pipeline: everything one model replica spans
    pp_ranks: List[int] = field(default_factory=lambda: [0])

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @cached_property
    def coord(self) -> RankCoord:
        return grid_coords(self.rank, self.tp, self.dp, self.pp)

    @property
    def tp_rank(self) -> int:
        return self.coord.tp

    @property
    def dp_rank(self) -> int:
        return self.coord.dp

    @property
    def pp_rank(self) -> int:
        return self.coord.pp

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
    def build(cls, tp: int, pp: int, timeout: Optional[timedelta] = None) -> "ParallelState":
        """Creates every group; all ranks must call it in the same order (collective).
        timeout: for collectives on these groups (torch's new groups do not inherit the world
        group's; parallel.timeout_minutes)."""
        world, rank = dist.get_world_size(), dist.get_rank()
        if tp < 1 or pp < 1 or world % (tp * pp):
            raise ValueError(f"a world of {world} ranks does not split into tensor parallel "
                             f"{tp} x pipeline parallel {pp} x a data-parallel size")
        state = cls(tp=tp, pp=pp, dp=world // (tp * pp), rank=rank)
        kwargs = {"timeout": timeout} if timeout is not None else {}

        def mine(axes: str):
            """new_group for every set of ranks that differ only along `axes` (of t, d, p);
            returns (this rank's group, its ranks)."""
            found = None
            for ranks in _rank_sets(tp, state.dp, pp, axes):
                group = dist.new_group(ranks, **kwargs)
                if rank in ranks:
                    found = (group, ranks)
            return found

        state.tp_group = mine("t")[0]
        state.dp_group = mine("d")[0]
        state.pp_group, state.pp_ranks = mine("p")
        # With one stage a replica is its tensor-parallel group: no second group of the same ranks.
        state.mp_group = state.tp_group if pp == 1 else mine("tp")[0]
        return state


def _rank_sets(tp: int, dp: int, pp: int, axes: str) -> List[List[int]]:
    """Every list of global ranks that share their coordinates outside `axes` (a string of the
    letters t, d, p), in a fixed order, each list ordered pipeline-major then tensor."""
    sizes = {"t": tp, "d": dp, "p": pp}
    fixed = [a for a in "pdt" if a not in axes]
    varying = [a for a in "pdt" if a in axes]
    out = []
    for outer in itertools.product(*(range(sizes[a]) for a in fixed)):
        coord = dict(zip(fixed, outer))
        ranks = []
        for inner in itertools.product(*(range(sizes[a]) for a in varying)):
            coord.update(zip(varying, inner))
            ranks.append(grid_rank(coord["t"], coord["d"], coord["p"], tp, dp))
        out.append(ranks)
    return out


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
