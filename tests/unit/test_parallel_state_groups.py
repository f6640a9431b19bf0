"""The rank grid's groups without a process group: every rank set of an axis, in the order the
groups are created (all ranks must agree), and a world that does not split is refused."""
import pytest

from megatron.parallel.state import ParallelState, _rank_sets, grid_coords


def test_rank_sets_cover_each_axis_once():
    tp, dp, pp = 2, 3, 2
    for axes, size in (("t", tp), ("d", dp), ("p", pp), ("tp", tp * pp)):
        sets = _rank_sets(tp, dp, pp, axes)
        assert sorted(r for s in sets for r in s) == list(range(tp * dp * pp)), axes
        assert all(len(s) == size for s in sets), axes
        for s in sets:  # members differ only along the named axes
            coords = [grid_coords(r, tp, dp, pp) for r in s]
            for name, field in (("t", "tp"), ("d", "dp"), ("p", "pp")):
                if name not in axes:
                    assert len({getattr(c, field) for c in coords}) == 1, (axes, s)


def test_tensor_parallel_groups_are_consecutive_ranks():
    assert _rank_sets(4, 2, 2, "t") == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11],
                                        [12, 13, 14, 15]]
    assert _rank_sets(2, 2, 2, "tp") == [[0, 1, 4, 5], [2, 3, 6, 7]]


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
