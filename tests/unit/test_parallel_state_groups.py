"""The rank grid's groups without a process group: every rank set of an axis, in the order the
groups are created (all ranks must agree), and a world that does not split is refused."""
import pytest

from megatron.parallel.state import ParallelState, dense_grid


def test_rank_sets_cover_each_axis_once():
    tp, dp, pp = 2, 3, 2
    grid = dense_grid(tp=tp, pp=pp, dp=dp)
    for group, size in (("tp", tp), ("dp", dp), ("pp", pp), ("mp", tp * pp)):
        sets = grid.rank_sets(group)
        assert sorted(r for s in sets for r in s) == list(range(tp * dp * pp)), group
        assert all(len(s) == size for s in sets), group
        for s in sets:  # members differ only along the group's axes
            for axis in ("tp", "dp", "pp"):
                if axis not in grid.span(group):
                    assert len({grid.position(r)[axis] for r in s}) == 1, (group, s)


def test_tensor_parallel_groups_are_consecutive_ranks():
    assert dense_grid(tp=4, pp=2, dp=2).rank_sets("tp") == [
        [0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert dense_grid(tp=2, pp=2, dp=2).rank_sets("mp") == [[0, 1, 4, 5], [2, 3, 6, 7]]


def test_coordinates_of_a_rank():
    s = ParallelState(tp=2, pp=2, dp=2, rank=5)
    assert (s.tp_rank, s.dp_rank, s.pp_rank) == (1, 0, 1)


def test_a_world_that_does_not_split_is_refused(monkeypatch):
    import torch.distributed as dist
    monkeypatch.setattr(dist, "get_world_size", lambda: 6)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    with pytest.raises(ValueError, match="a world of 6 ranks does not split into tensor "
                                         "parallel 4 x pipeline parallel 1"):
        ParallelState.build(4, 1)
