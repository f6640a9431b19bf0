"""The context-parallel sequence layout (parallel/cp_layout.py): which tokens each rank holds
under every algorithm, and the hybrid's ring x Ulysses groups. A failure here moves tokens,
positions and labels together, so the distributed parity tests would fail without saying why."""
import pytest
import torch

from megatron.parallel.cp_layout import CPLayout, ring_positions, split_grid, token_index
from megatron.parallel.state import dense_grid


def test_ulysses_keeps_the_contiguous_slice():
    layout = CPLayout.of("ulysses", 4)
    assert [token_index(16, c, layout).tolist() for c in range(4)] == \
        [list(range(4 * c, 4 * c + 4)) for c in range(4)]
    assert not layout.balanced


def test_ring_gives_rank_r_chunks_r_and_2C_minus_1_minus_r():
    assert ring_positions(8, 0, 2).tolist() == [0, 1, 6, 7]
    assert ring_positions(8, 1, 2).tolist() == [2, 3, 4, 5]
    layout = CPLayout.of("ring", 4)
    assert token_index(16, 1, layout).tolist() == [2, 3, 12, 13]


@pytest.mark.parametrize("algo, cp, u", [("ring", 2, 0), ("ring", 3, 0), ("allgather", 4, 0),
                                         ("hybrid", 4, 2), ("hybrid", 8, 4), ("hybrid", 8, 2),
                                         ("ulysses", 4, 0)])
def test_every_token_is_held_once(algo, cp, u):
    layout = CPLayout.of(algo, cp, u)
    seq = 2 * cp * 4
    held = torch.cat([token_index(seq, c, layout) for c in range(cp)])
    assert sorted(held.tolist()) == list(range(seq))


def test_hybrid_ulysses_ranks_split_their_ring_ranks_tokens_in_order():
    layout = CPLayout.of("hybrid", 4, 2)  # U=2 inside, R=2 across
    assert (layout.ulysses, layout.ring) == (2, 2)
    ring0 = ring_positions(16, 0, 2).tolist()
    assert token_index(16, 0, layout).tolist() + token_index(16, 1, layout).tolist() == ring0


def test_hybrid_groups_split_the_cp_axis_ring_outer_ulysses_inner():
    dense = dense_grid(tp=2, cp=4)
    grid = split_grid(dense, CPLayout.of("hybrid", 4, 2))
    assert grid.world_size == dense.world_size
    # rank = cp_rank * tp + tp_rank; cp_rank = ring_rank * U + ulysses_rank
    assert grid.members(0, "cp_ulysses") == [0, 2]
    assert grid.members(0, "cp_ring") == [0, 4]
    assert grid.members(3, "cp_ring") == [3, 7]
