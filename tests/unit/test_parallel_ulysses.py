"""Ulysses' bookkeeping without a process group: the rank grid with a context-parallel axis,
and the key/value replication that lets any degree dividing the query heads work. The exchange
itself is checked against one rank in tests/distributed/test_parallel_context_parallel.py."""
import pytest

from megatron.parallel.state import ParallelState, dense_grid, grid_coords
from megatron.parallel.ulysses import kv_replicas


def test_the_grid_orders_pp_dp_cp_tp_and_stores_the_shard_over_data_x_context():
    grid = dense_grid(tp=2, pp=2, dp=2, cp=2)
    assert grid.rank_sets("cp")[:2] == [[0, 2], [1, 3]]
    assert grid.rank_sets("dp_cp")[0] == [0, 2, 4, 6]
    s = ParallelState(tp=2, pp=2, dp=2, cp=2, rank=11)  # pp 1, dp 0, cp 1, tp 1
    assert (s.pp_rank, s.dp_rank, s.cp_rank, s.tp_rank) == (1, 0, 1, 1)
    # dp_cp = dp_rank * cp + cp_rank
    assert s.coord == grid_coords(11, 2, 2, 2, cp=2) == (1, 1, 1)
    assert s.world_size == 16 and s.dp_cp == 4


def test_without_context_parallelism_the_stored_coordinate_is_unchanged():
    for rank in range(8):
        assert grid_coords(rank, 2, 2, 2) == grid_coords(rank, 2, 2, 2, cp=1)
        assert ParallelState(tp=2, pp=2, dp=2, rank=rank).coord.dp_cp == (rank // 2) % 2


def _served(kv_heads, q_per_group, cp):
    """For each rank: (the key/value groups its query heads belong to, the groups of the
    key/value copies it receives), after replication by kv_replicas."""
    r = kv_replicas(kv_heads, q_per_group, cp)
    n, copies = kv_heads * q_per_group, kv_heads * r
    out = []
    for c in range(cp):
        q_groups = [h // q_per_group for h in range(c * n // cp, (c + 1) * n // cp)]
        kv = [j // r for j in range(c * copies // cp, (c + 1) * copies // cp)]
        per_copy = len(q_groups) // len(kv)
        out.append((q_groups, [g for g in kv for _ in range(per_copy)]))
    return r, copies, out


@pytest.mark.parametrize("kv_heads, q_per_group, cp", [
    (4, 1, 2), (4, 1, 4), (2, 2, 4), (1, 4, 2), (1, 4, 4), (2, 3, 3), (2, 3, 6), (4, 2, 8),
    (3, 4, 4), (6, 2, 4)])
def test_every_rank_gets_the_key_value_heads_of_its_query_heads(kv_heads, q_per_group, cp):
    r, copies, ranks = _served(kv_heads, q_per_group, cp)
    assert copies % cp == 0 and q_per_group % r == 0
    for q_groups, kv_groups in ranks:
        assert q_groups == kv_groups


def test_no_replication_when_the_key_value_heads_split():
    assert kv_replicas(4, 2, 2) == 1 and kv_replicas(8, 1, 4) == 1
    assert kv_replicas(2, 2, 4) == 2  # two heads, four ranks: each head twice
