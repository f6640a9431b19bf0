"""Parallel axes as data, without a process group: a grid with an axis the grid module has never
heard of gets its rank sets, coordinates and groups; today's pp x dp x cp x tp layouts keep
every rank set, group and stored coordinate they had when each axis was a field; a second grid
over the same ranks (experts) gets its own groups and reuses the sets it shares; and nothing
outside the engine folds context-parallel ranks into data parallel.

A failure in the first test points at parallel/grid.py; in the second, at the dense
declaration in parallel/state.py (DENSE_AXES, DENSE_GROUPS, RankCoord) or at build_groups."""
import io
import itertools
import os
import re
import tokenize

import pytest
import torch.distributed as dist

from megatron.parallel.grid import Grid, build_groups
from megatron.parallel.state import DENSE_GROUPS, ParallelState, RankCoord, dense_grid
from tests.support.paths import ROOT


class Recorder:
    """new_group without torch.distributed: every call in order; a group is its rank list."""

    def __init__(self):
        self.calls = []

    def __call__(self, ranks, **kwargs):
        self.calls.append(tuple(ranks))
        return tuple(ranks)


# --- an axis the grid module does not name ------------------------------------------------------

EX_GRID = Grid((("pp", 2), ("ex", 2), ("dp", 1), ("tp", 2)),
               {"tp": ("tp",), "pp": ("pp",), "ex": ("ex",), "ex_tp": ("tp", "ex")})


def test_an_extra_axis_gets_its_groups_and_coordinates():
    assert EX_GRID.world_size == 8
    assert EX_GRID.rank_sets("ex") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert EX_GRID.rank_sets("ex_tp") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert EX_GRID.span("ex_tp") == ("ex", "tp")  # kept in grid order
    assert EX_GRID.position(7) == {"pp": 1, "ex": 1, "dp": 0, "tp": 1}
    assert [EX_GRID.index(r, "ex") for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert EX_GRID.index(7, "ex_tp") == 3 and EX_GRID.members(6, "ex") == [4, 6]
    for rank in range(8):
        assert EX_GRID.rank_at(EX_GRID.position(rank)) == rank
        for group in ("tp", "pp", "ex", "ex_tp"):  # the index is the group rank torch gives
            members = EX_GRID.members(rank, group)
            assert members in EX_GRID.rank_sets(group)
            assert members.index(rank) == EX_GRID.index(rank, group)
    state = ParallelState.on_grid(EX_GRID, rank=6)
    assert (state.tp, state.pp, state.dp, state.cp, state.size("ex")) == (2, 2, 1, 1, 2)
    assert (state.pp_rank, state.tp_rank, state.index("ex")) == (1, 0, 1)
    assert state.pp_ranks == [2, 6] and state.is_last_stage


def test_an_extra_axis_gets_one_process_group_per_rank_set():
    new_group = Recorder()
    made = {}
    mine = [build_groups(EX_GRID, rank, new_group, made) for rank in range(8)]
    # One `made` for the stand-in world: rank 0's calls make every set (tp 4, pp 4, ex 4,
    # ex_tp 2), each once, and the other ranks find theirs made.
    assert len(new_group.calls) == len(set(new_group.calls)) == 4 + 4 + 4 + 2
    for rank, groups in enumerate(mine):
        assert {name: list(g) for name, g in groups.items()} == {
            name: EX_GRID.members(rank, name) for name in ("tp", "pp", "ex", "ex_tp")}


def test_a_grid_refuses_unknown_axes_and_repeated_names():
    with pytest.raises(ValueError, match="group 'ep' spans"):
        Grid((("dp", 2),), {"ep": ("ep",)})
    with pytest.raises(ValueError, match="distinct axis names"):
        Grid((("dp", 2), ("dp", 2)))
    with pytest.raises(KeyError, match="no group 'ep'"):
        EX_GRID.rank_sets("ep")


# --- today's layouts, unchanged -----------------------------------------------------------------

def _old_rank(p, d, c, t, dp, cp, tp):
    return ((p * dp + d) * cp + c) * tp + t


def _old_sets(tp, pp, dp, cp, axes):
    """The rank sets as the grid of one field per axis made them: for each setting of the
    other axes (outer axes first), the ranks along `axes`, ascending."""
    sizes = {"pp": pp, "dp": dp, "cp": cp, "tp": tp}
    sets = {}
    for p, d, c, t in itertools.product(range(pp), range(dp), range(cp), range(tp)):
        at = {"pp": p, "dp": d, "cp": c, "tp": t}
        key = tuple(at[a] for a in sizes if a not in axes)
        sets.setdefault(key, []).append(_old_rank(p, d, c, t, dp, cp, tp))
    return [sets[k] for k in sorted(sets)]


def _layouts(max_world=16):
    for tp, pp, dp, cp in itertools.product((1, 2, 3, 4), (1, 2, 4), (1, 2, 3), (1, 2, 4)):
        if tp * pp * dp * cp <= max_world:
            yield tp, pp, dp, cp


@pytest.mark.parametrize("tp, pp, dp, cp", list(_layouts()))
def test_todays_layouts_keep_every_rank_set_and_stored_coordinate(tp, pp, dp, cp):
    grid = dense_grid(tp=tp, pp=pp, dp=dp, cp=cp)
    spans = {"tp": ("tp",), "dp": ("dp",), "pp": ("pp",), "mp": ("pp", "tp"), "cp": ("cp",),
             "dp_cp": ("dp", "cp")}
    for group, axes in spans.items():
        assert grid.rank_sets(group) == _old_sets(tp, pp, dp, cp, axes), group
    for p, d, c, t in itertools.product(range(pp), range(dp), range(cp), range(tp)):
        rank = _old_rank(p, d, c, t, dp, cp, tp)
        state = ParallelState(tp=tp, pp=pp, dp=dp, cp=cp, rank=rank)
        assert (state.pp_rank, state.dp_rank, state.cp_rank, state.tp_rank) == (p, d, c, t)
        assert state.coord == RankCoord(tp=t, pp=p, dp_cp=d * cp + c)
        assert (state.dp_cp, state.dp_cp_rank) == (dp * cp, d * cp + c)


def test_the_literal_groups_of_four_ranks():
    grid = dense_grid(tp=2, pp=2)
    assert grid.rank_sets("pp") == [[0, 2], [1, 3]]
    assert grid.rank_sets("dp") == [[0], [1], [2], [3]]
    assert dense_grid(tp=2, dp=2).rank_sets("dp") == [[0, 2], [1, 3]]
    assert dense_grid(cp=2, dp=2).rank_sets("dp_cp") == [[0, 1, 2, 3]]


def _build_all(monkeypatch, world, tp, pp, cp):
    """ParallelState.build on every rank of a world, with a recorded new_group."""
    new_group = Recorder()
    monkeypatch.setattr(dist, "get_world_size", lambda: world)
    monkeypatch.setattr(dist, "new_group", new_group)
    states = []
    for rank in range(world):
        monkeypatch.setattr(dist, "get_rank", lambda r=rank: r)
        states.append(ParallelState.build(tp, pp, cp=cp))
    return states, new_group


@pytest.mark.parametrize("tp, pp, cp, world", [(2, 2, 2, 16), (2, 1, 1, 4), (1, 2, 1, 4),
                                               (1, 1, 2, 4), (1, 1, 1, 1)])
def test_built_groups_hold_todays_members_each_made_once(monkeypatch, tp, pp, cp, world):
    states, new_group = _build_all(monkeypatch, world, tp, pp, cp)
    per_rank = len(new_group.calls) // world
    assert all(new_group.calls[:per_rank] == new_group.calls[r * per_rank:(r + 1) * per_rank]
               for r in range(world))  # every rank creates the same groups in the same order
    assert len(set(new_group.calls)) == per_rank  # one group per rank set
    for state in states:
        for name, _ in DENSE_GROUPS:
            assert list(state.group(name)) == state.grid.members(state.rank, name), name
        # the groups that were one object before still are
        assert (state.mp_group is state.tp_group) == (pp == 1)
        assert (state.dp_cp_group is state.dp_group) == (cp == 1)


# --- a second grid over the same ranks ----------------------------------------------------------

def test_an_expert_grid_over_the_same_ranks(monkeypatch):
    """MoE parallel folding: per pipeline stage the expert grid splits the tp x dp ranks into
    expert-data x expert x expert-tensor; its pipeline groups are the dense grid's."""
    states, new_group = _build_all(monkeypatch, 8, tp=2, pp=2, cp=1)  # dp 2
    experts = Grid((("pp", 2), ("edp", 1), ("ep", 4), ("etp", 1)),
                   {"ep": ("ep",), "edp": ("edp",), "etp": ("etp",), "pp": ("pp",)})
    dense_calls = len(new_group.calls)
    added = [state.add_grid(experts) for state in states]
    assert len(new_group.calls) - dense_calls == 8 * 2  # the two ep sets; the rest existed
    for state, groups in zip(states, added):
        assert groups["pp"] is state.pp_group
        assert list(groups["ep"]) == ([0, 1, 2, 3] if state.rank < 4 else [4, 5, 6, 7])
        assert experts.index(state.rank, "ep") == state.dp_rank * 2 + state.tp_rank
        assert experts.position(state.rank)["pp"] == state.pp_rank
    with pytest.raises(ValueError, match="grid of 4 ranks"):
        states[0].add_grid(Grid((("ep", 4),), {"ep": ("ep",)}))


# --- the stored coordinate names what it shards over --------------------------------------------

def test_the_stored_coordinate_names_its_groups():
    declared = {name for name, _ in DENSE_GROUPS}
    assert set(RankCoord._fields) <= declared and "dp" not in RankCoord._fields
    assert dict(DENSE_GROUPS)["dp_cp"] == ("dp", "cp")
    grid = dense_grid(tp=2, pp=2, dp=2, cp=2)
    coords = [RankCoord.of(grid, r) for r in range(16)]
    assert {c.dp_cp for c in coords} == set(range(grid.group_size("dp_cp")))
    assert {ParallelState(2, 2, 2, r, 2).dp_rank for r in range(16)} == {0, 1}  # dp alone


# --- nothing outside the engine folds context ranks into data parallel ------------------------

FOLDING = re.compile(
    r"\b(\w+\.)?dp(_\w+)?\s*\*\s*(\w+\.)?cp(_\w+)?\b|\b(\w+\.)?cp(_\w+)?\s*\*\s*(\w+\.)?dp\b"
    r"|\*\s*(\w+\.)?cp\s*\+|data_parallel_size\s*\*[^\n]*context_parallel"
    r"|context_parallel_size\s*\*[^\n]*data_parallel")
# engine/ is DeepSpeed's adapter, where our dp_cp group becomes DeepSpeed's data parallel; the
# planner prices layouts without torch and cannot import parallel/ (docs/architecture.md), so its
# Layout names the product itself (zero_dp, world).
ALLOWED = ("megatron/engine/", "megatron/planner/")


# Literal text: a docstring or message may show a formula; only code folds.
_TEXT = {tokenize.STRING, tokenize.COMMENT, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}


def _code_lines(text):
    """Each line's code as written, with strings and comments blanked."""
    lines = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in _TEXT and tok.start[0] == tok.end[0] and tok.string.strip():
            line = lines.setdefault(tok.start[0], [])
            line += [" "] * (tok.start[1] - len(line)) + list(tok.string)
    return {n: "".join(chars) for n, chars in lines.items()}


def test_the_folding_scan_catches_a_fold():
    for fold in ("shards = state.dp * state.cp", "c = dp_rank * cp + cp_rank",
                 "n = lay.data_parallel_size * lay.context_parallel_size", "cp * dp"):
        assert FOLDING.search(_code_lines(fold + "\n")[1]), fold
    assert _code_lines('x = "dp * cp" + y  # dp * cp\n')[1].split() == ["x", "=", "+", "y"]


def test_no_file_outside_the_engine_folds_context_into_data_parallel():
    found = []
    for folder, _, files in os.walk(os.path.join(ROOT, "megatron")):
        for name in sorted(f for f in files if f.endswith(".py")):
            rel = os.path.relpath(os.path.join(folder, name), ROOT).replace(os.sep, "/")
            if rel.startswith(ALLOWED):
                continue
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                code = _code_lines(f.read())
            found += [f"{rel}:{n}: {line}" for n, line in code.items() if FOLDING.search(line)]
    assert not found, ("data x context parallel computed by hand; ask the grid for the dp_cp "
                       "group (ParallelState.dp_cp, Grid.group_size):\n" + "\n".join(found))
