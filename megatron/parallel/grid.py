"""A rank grid as data: named axes with their sizes, outermost first, and the groups declared
over them, each a name and the axes it spans. Where a rank sits and which ranks share a group
follow from that declaration by one rule, so a new axis is an entry in a list rather than a
field, a group builder and a coordinate formula in every file that needs one.

A rank is a mixed-radix number over the axes, the last varying fastest: for axes
(a0, n0), (a1, n1), ..., rank = (c0 * n1 + c1) * n2 + c2 .... A group spanning some axes is,
for each setting of the other axes, the ranks that differ only along its own; a rank's index in
its group is the same mixed radix over the group's axes alone (taken in grid order), which is
its position in the group's ascending rank list, the group rank torch gives it.

Several grids may lie over the same ranks (the dense one, and one for experts whose expert-data,
expert and expert-tensor axes fold the same ranks differently, as Megatron core's "MoE parallel
folding" does); each is its own Grid, and build_groups makes one process group per distinct
rank set across all of them. Torch-free: the caller passes the function that makes a process
group (parallel/state.py passes torch.distributed.new_group; the unit tests pass a recorder)."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Tuple


@dataclass(frozen=True)
class Grid:
    """axes: (name, size) pairs, outermost first. groups: group name -> the axes it spans (a
    mapping or pairs); a span is kept in grid order whatever order it was written in."""
    axes: Tuple[Tuple[str, int], ...]
    groups: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()

    def __post_init__(self):
        axes = tuple((str(n), int(s)) for n, s in self.axes)
        names = [n for n, _ in axes]
        if len(set(names)) != len(names) or any(s < 1 for _, s in axes):
            raise ValueError(f"a grid needs distinct axis names and sizes of at least 1, "
                             f"not {list(axes)}")
        pairs = self.groups.items() if isinstance(self.groups, Mapping) else self.groups
        groups = []
        for name, span in pairs:
            unknown = [a for a in span if a not in names]
            if unknown or name in dict(groups):
                raise ValueError(f"group {name!r} spans {list(span)}: each group is named "
                                 f"once and spans axes of the grid {names}")
            groups.append((str(name), tuple(a for a in names if a in span)))
        object.__setattr__(self, "axes", axes)
        object.__setattr__(self, "groups", tuple(groups))

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(n for n, _ in self.axes)

    @property
    def sizes(self) -> Dict[str, int]:
        return dict(self.axes)

    @property
    def world_size(self) -> int:
        return math.prod(s for _, s in self.axes)

    def span(self, group: str) -> Tuple[str, ...]:
        """The axes a declared group spans, in grid order."""
        for name, span in self.groups:
            if name == group:
                return span
        raise KeyError(f"the grid declares no group {group!r} (it has "
                       f"{[n for n, _ in self.groups]})")

    def position(self, rank: int) -> Dict[str, int]:
        """A rank's coordinate along every axis."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a grid of {self.world_size} ranks")
        out = {}
        for name, size in reversed(self.axes):
            out[name], rank = rank % size, rank // size
        return {n: out[n] for n in self.names}

    def rank_at(self, position: Mapping[str, int]) -> int:
        """The rank at a coordinate (the inverse of position); an axis left out is at 0."""
        rank = 0
        for name, size in self.axes:
            rank = rank * size + position.get(name, 0)
        return rank

    def group_size(self, group: str) -> int:
        return math.prod(self.sizes[a] for a in self.span(group))

    def index(self, rank: int, group: str) -> int:
        """A rank's index in its group of `group`: the mixed radix over the group's axes."""
        at, sizes, out = self.position(rank), self.sizes, 0
        for axis in self.span(group):
            out = out * sizes[axis] + at[axis]
        return out

    def rank_sets(self, group: str) -> List[List[int]]:
        """Every rank set of `group`, in a fixed order (all ranks must create groups alike),
        each ascending."""
        span, sizes = self.span(group), self.sizes
        fixed = [a for a in self.names if a not in span]
        out = []
        for outer in itertools.product(*(range(sizes[a]) for a in fixed)):
            at = dict(zip(fixed, outer))
            ranks = []
            for inner in itertools.product(*(range(sizes[a]) for a in span)):
                at.update(zip(span, inner))
                ranks.append(self.rank_at(at))
            out.append(ranks)
        return out

    def members(self, rank: int, group: str) -> List[int]:
        """The ranks of `rank`'s own group of `group`."""
        at = self.position(rank)
        span, sizes = self.span(group), self.sizes
        return [self.rank_at({**at, **dict(zip(span, inner))})
                for inner in itertools.product(*(range(sizes[a]) for a in span))]


def build_groups(grid: Grid, rank: int, new_group: Callable[[List[int]], object],
                 made: Optional[Dict[Tuple[int, ...], object]] = None) -> Dict[str, object]:
    """This rank's process group of every group the grid declares. Collective: new_group is
    called on every rank for every rank set, in declaration order. A rank set met before (mp
    when pp = 1, dp_cp when cp = 1, every group of size-1 axes alike, or a set of another
    grid built with the same `made`) gets the group made for it then: one process group per
    set of ranks, as torch's group creation is slow and every group holds resources."""
    made = {} if made is None else made
    mine = {}
    for name, _ in grid.groups:
        for ranks in grid.rank_sets(name):
            key = tuple(ranks)
            if key not in made:
                made[key] = new_group(list(ranks))
            if rank in key:
                mine[name] = made[key]
    return mine
