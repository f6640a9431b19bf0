"""The dense rank grid: axes pp, dp, cp, tp, outermost first (tensor varies fastest), and the
groups the trainer uses, declared over them; parallel/grid.py builds any such declaration.

rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank, so the TP ranks of one group
are consecutive and land on one node (the paper: TP inside a node, PP across nodes), and the
context-parallel ranks of one sequence sit next to them. The ranks of a context-parallel group
hold the same parameters, so gradients are reduced and ZeRO state is partitioned over data x
context parallel: the group dp_cp, named for the axes it spans. Only DeepSpeed's adapter
(engine/mpu.py) calls that DeepSpeed's data-parallel group; in DeepSpeed's
PipeModelDataParallelTopology order (axes pipe, data, model) it is the data axis.

A new axis goes into DENSE_AXES at its place in the rank order, and the groups that span it
into DENSE_GROUPS; nothing else here changes. Axes that fold the same ranks differently (the
expert-data, expert and expert-tensor axes of Megatron core's "MoE parallel folding") are a
second Grid over the same world, whose groups ParallelState.add_grid builds."""
from __future__ import annotations

import functools
import logging
from datetime import timedelta
from functools import cached_property
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch.distributed as dist

from megatron.config import context_parallel
from megatron.parallel.cp_layout import CPLayout, split_grid
from megatron.parallel.grid import Grid, build_groups

log = logging.getLogger(__name__)

DENSE_AXES = ("pp", "dp", "cp", "tp")
DENSE_GROUPS = (
    ("tp", ("tp",)),
    ("dp", ("dp",)),  # data parallel: replicas that read different samples
    ("pp", ("pp",)),
    ("mp", ("pp", "tp")),  # tensor x pipeline: everything one model replica spans
    # Context parallel (Ulysses): ranks that share samples, each holding 1/cp of the sequence.
    ("cp", ("cp",)),
    # The ranks that hold the same parameters: gradients are averaged and ZeRO state
    # partitioned over them.
    ("dp_cp", ("dp", "cp")),
    # The ranks that split one micro-batch's tokens (a MoE layer's auxiliary losses are
    # summed over them: model/moe/layer.py); the tp or cp group itself when the other is 1.
    ("tp_cp", ("cp", "tp")),
)


def dense_grid(tp: int = 1, pp: int = 1, dp: int = 1, cp: int = 1) -> Grid:
    sizes = {"pp": pp, "dp": dp, "cp": cp, "tp": tp}
    return Grid(tuple((axis, sizes[axis]) for axis in DENSE_AXES), DENSE_GROUPS)


class RankCoord(NamedTuple):
    """A rank's position as stored: its index in its group of each of tp, pp and dp_cp (each
    field names a group of DENSE_GROUPS). Checkpoint shard files are named by it and hold it;
    dp_cp is the rank's ZeRO shard, over data x context parallel, which is the data-parallel
    rank when cp = 1 (so every earlier checkpoint, whose files carry the data-parallel rank,
    reads as before). The context-parallel degree itself is in the checkpoint's layout record."""
    tp: int
    pp: int
    dp_cp: int

    @classmethod
    def of(cls, grid: Grid, rank: int) -> "RankCoord":
        return cls(*(grid.index(rank, group) for group in cls._fields))


def grid_coords(rank: int, tp: int, dp: int, pp: int, cp: int = 1) -> RankCoord:
    """The stored position of a global rank on a dense grid of these sizes."""
    return RankCoord.of(dense_grid(tp=tp, pp=pp, dp=dp, cp=cp), rank)


def _new_group(timeout: Optional[timedelta]):
    # torch's new groups do not inherit the world group's timeout (parallel.timeout_minutes).
    if timeout is None:
        return dist.new_group
    return functools.partial(dist.new_group, timeout=timeout)


class ParallelState:
    """Where this rank sits and its process groups: a Grid, the rank, and this rank's group of
    each group the grid declares (none without torch.distributed). An object passed to layers
    explicitly; never a module global. The named properties read the dense grid's axes and
    groups; an axis a grid does not declare has one rank."""

    def __init__(self, tp: int = 1, pp: int = 1, dp: int = 1, rank: int = 0, cp: int = 1):
        self.grid = dense_grid(tp=tp, pp=pp, dp=dp, cp=cp)
        self.rank = rank
        self.groups: Dict[str, object] = {}
        self._made: Dict[Tuple[int, ...], object] = {}  # every group made here, by rank set
        # How the cp ranks split the sequence and attend (parallel/cp_layout.py).
        self.cp_layout = CPLayout.of(context_parallel.DEFAULT, cp)

    @classmethod
    def on_grid(cls, grid: Grid, rank: int = 0) -> "ParallelState":
        """A rank of any grid, without process groups (build() makes the dense grid's)."""
        state = cls(rank=rank)
        state.grid = grid
        return state

    @classmethod
    def single(cls) -> "ParallelState":
        """A world of one, usable without torch.distributed (references and unit tests)."""
        return cls()

    @classmethod
    def build(cls, tp: int, pp: int, timeout: Optional[timedelta] = None,
              cp: int = 1, cp_layout: Optional[CPLayout] = None) -> "ParallelState":
        """Creates every group; all ranks must call it in the same order (collective).
        timeout: for collectives on these groups (torch's new groups do not inherit the world
        group's; parallel.timeout_minutes). cp: parallel.context_parallel_size; cp_layout: its
        algorithm (Ulysses when not given); hybrid adds its ring and Ulysses groups."""
        world, rank = dist.get_world_size(), dist.get_rank()
        if tp < 1 or pp < 1 or cp < 1 or world % (tp * pp * cp):
            raise ValueError(f"a world of {world} ranks does not split into tensor parallel "
                             f"{tp} x pipeline parallel {pp} x context parallel {cp} x a "
                             "data-parallel size")
        state = cls(tp=tp, pp=pp, dp=world // (tp * pp * cp), rank=rank, cp=cp)
        state.groups = build_groups(state.grid, rank, _new_group(timeout), state._made)
        if cp_layout is not None:
            state.cp_layout = cp_layout
            if cp_layout.balanced and cp_layout.ulysses > 1:
                state.groups.update(state.add_grid(split_grid(state.grid, cp_layout), timeout))
        return state

    def add_grid(self, grid: Grid, timeout: Optional[timedelta] = None) -> Dict[str, object]:
        """This rank's groups of a second grid over the same ranks (experts), by group name; a
        rank set this state has a group for already keeps it. Collective, like build()."""
        if grid.world_size != self.world_size:
            raise ValueError(f"a grid of {grid.world_size} ranks does not lie over this world "
                             f"of {self.world_size}")
        return build_groups(grid, self.rank, _new_group(timeout), self._made)

    # --- generic: any axis, any declared group ------------------------------------------------

    def size(self, axis: str) -> int:
        return self.grid.sizes.get(axis, 1)

    @cached_property
    def position(self) -> Dict[str, int]:
        """This rank's coordinate along every axis of the grid."""
        return self.grid.position(self.rank)

    def index(self, group: str) -> int:
        """This rank's index in its group of `group` (its group rank)."""
        return self.grid.index(self.rank, group)

    def group(self, name: str) -> Optional[object]:
        """This rank's process group of `name`; None without torch.distributed."""
        return self.groups.get(name)

    @cached_property
    def coord(self) -> RankCoord:
        return RankCoord.of(self.grid, self.rank)

    @property
    def world_size(self) -> int:
        return self.grid.world_size

    # --- the dense grid by name ---------------------------------------------------------------

    tp = property(lambda self: self.size("tp"))
    pp = property(lambda self: self.size("pp"))
    dp = property(lambda self: self.size("dp"))
    cp = property(lambda self: self.size("cp"))
    tp_rank = property(lambda self: self.position.get("tp", 0))
    pp_rank = property(lambda self: self.position.get("pp", 0))
    dp_rank = property(lambda self: self.position.get("dp", 0))
    cp_rank = property(lambda self: self.position.get("cp", 0))
    tp_group = property(lambda self: self.group("tp"))
    pp_group = property(lambda self: self.group("pp"))
    dp_group = property(lambda self: self.group("dp"))
    cp_group = property(lambda self: self.group("cp"))
    mp_group = property(lambda self: self.group("mp"))
    dp_cp_group = property(lambda self: self.group("dp_cp"))

    @property
    def dp_cp(self) -> int:
        """Ranks that hold the same parameters: the size of the dp_cp group."""
        return self.grid.group_size("dp_cp")

    @property
    def dp_cp_rank(self) -> int:
        return self.coord.dp_cp

    @property
    def pp_ranks(self) -> List[int]:
        return self.grid.members(self.rank, "pp")

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1


def set_collective_timeout(seconds: float) -> int:
    """Sets how long a collective of every process group of this process (the world, ours and
    DeepSpeed's) may wait before its backend gives up; the number of groups set. The hang
    watchdog keeps it just above its own limit for the phase, so the watchdog, which says
    where, fires first (training/watchdog.py)."""
    if not dist.is_initialized():
        return 0
    from torch.distributed import distributed_c10d as c10d
    groups = [g for g in _group_map() if not c10d._rank_not_in_group(g)]
    for group in groups:
        c10d._set_pg_timeout(timedelta(seconds=seconds), group)
    return len(groups)


def live_groups() -> frozenset:
    """The names of the process groups this process holds now, the world's included (empty
    when not joined); destroy_groups_since ends those created after. Names, not the groups:
    a later job's record of what lived before it would otherwise hold an earlier job's groups
    (their gloo threads running) after that job closed."""
    if not dist.is_initialized():
        return frozenset()
    return frozenset(_group_names().values())


def destroy_groups_since(before: frozenset, keep: frozenset = frozenset()) -> None:
    """Destroys every process group created since `before` (live_groups()) by anyone but those
    named in `keep` (another job's, still alive): the layout's groups, DeepSpeed's pipeline grid and
    ZeRO's, a chunk executor's pairs. A run that ends keeps none: each gloo group holds a thread
    per peer and a socket, and a process that trains several runs (a sweep, the shared test
    launches) collected ~25 threads and ~37 file descriptors per PP2 run until the process
    ended. Not collective: each rank ends its own; a group a later run needs is built anew."""
    if not dist.is_initialized():
        return
    world = dist.GroupMember.WORLD
    for group, name in _group_names().items():
        if name not in before and name not in keep and group is not world:
            try:
                dist.destroy_process_group(group)
            except (RuntimeError, ValueError) as e:  # already gone: nothing of it left to end
                log.debug("process group already destroyed: %s", e)


def _group_map() -> dict:
    """torch's registry of this process's groups (distributed_c10d._world.pg_map)."""
    from torch.distributed import distributed_c10d as c10d
    return dict(c10d._world.pg_map)


def _group_names() -> dict:
    """Each of this process's groups' name, unique in the process (distributed_c10d._world
    .pg_names: a count of the groups made is part of each)."""
    from torch.distributed import distributed_c10d as c10d
    return dict(c10d._world.pg_names)
