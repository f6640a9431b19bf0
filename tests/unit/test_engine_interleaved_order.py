"""The interleaved 1F1B order (engine/interleaved_order.py) and the interleaved schedule's
record; the config rules of parallel.virtual_pipeline_size are in test_config_interleaving.py."""
import pytest

from megatron.config import schedules
from megatron.config.schedules.registry import Pipe
from megatron.engine import interleaved_order as order
from megatron.engine.chunks import chunk_slices

# (stages, chunks, micro-batches, group: parallel.pipeline_microbatch_group, 0 the stages)
LAYOUTS = [(2, 1, 4, 0), (2, 2, 4, 0), (2, 2, 8, 0), (4, 2, 8, 0), (4, 2, 16, 0), (4, 4, 4, 0),
           (8, 2, 16, 0), (2, 3, 6, 0),
           # grouped: counts that are not multiples of the stages, a last smaller group, a group
           # of all of them, a group larger than the stages where they would divide
           (2, 2, 5, 3), (4, 2, 6, 6), (4, 2, 10, 5), (4, 3, 14, 5), (2, 2, 7, 7), (4, 2, 8, 8)]


@pytest.mark.parametrize("p,v,m,g", LAYOUTS)
def test_every_chunk_pass_once_forward_before_backward(p, v, m, g):
    every = set()
    for r in range(p):
        ops = order.rank_ops(p, r, v, m, g)
        assert len(ops) == 2 * v * m and len(set(ops)) == len(ops)
        at = {op: i for i, op in enumerate(ops)}
        for local in range(v):
            for mb in range(m):
                assert at[(order.F, local, mb)] < at[(order.B, local, mb)]
                every.add(order.model_chunk(p, r, local))
        # each chunk runs its micro-batches in order, forward and backward: the gradients
        # accumulate in 1F1B's order
        for kind in (order.F, order.B):
            for local in range(v):
                mbs = [mb for k, c, mb in ops if k == kind and c == local]
                assert mbs == list(range(m))
    assert every == set(range(p * v))


@pytest.mark.parametrize("p,v,m,g", LAYOUTS)
def test_dependencies_hold_and_the_bubble_shrinks_by_v(p, v, m, g):
    """Replayed on every rank at once (sends never block, receives wait): no deadlock, and with
    a chunk forward of 1/v and backward of 2/v a stage's, the step takes
    m (F + B) + (p - 1)(F + B)/v: the bubble (p - 1)/(v m + p - 1) of the record, grouped
    micro-batches too (every group at least p: no dependency bubble)."""
    step = order.replay(p, v, m, [{order.F: 1.0 / v, order.B: 2.0 / v}] * p, group=g)
    assert step == pytest.approx(3 * m + 3 * (p - 1) / v)
    bubble = schedules.get("interleaved").bubble(Pipe(p, m, v), 0.0)
    assert (step - 3 * m) / step == pytest.approx(bubble)


def test_warmup_is_megatrons():
    assert [order.warmup(4, r, 2, 8) for r in range(4)] == [10, 8, 6, 4]
    assert order.warmup(4, 0, 2, 4) == 8  # m = p: every forward first
    assert [order.warmup(4, r, 1, 8) for r in range(4)] == [3, 2, 1, 0]
    # groups of N: 2 (p - r - 1) + (v - 1) N, so a group of 8 holds 4 more chunks in flight
    assert [order.warmup(4, r, 2, 8, 8) for r in range(4)] == [14, 12, 10, 8]


def test_the_default_group_is_the_stages_and_the_order_megatrons():
    """Group p is the order it was before groups existed: pass k runs micro-batch
    (k // (p v)) p + k % p on local chunk (k % (p v)) // p."""
    p, v, m = 4, 3, 12
    ops = order.rank_ops(p, 1, v, m)
    assert ops == order.rank_ops(p, 1, v, m, p) == order.Grouped(p).rank_ops(p, 1, v, m)
    forwards = [(c, mb) for kind, c, mb in ops if kind == order.F]
    assert forwards == [((k % (p * v)) // p, (k // (p * v)) * p + k % p) for k in range(m * v)]


@pytest.mark.parametrize("p,m,g", [(4, 6, 0), (4, 6, 4), (4, 6, 5), (4, 6, 7), (4, 6, 3)])
def test_micro_batches_the_groups_cannot_take_are_refused(p, m, g):
    """6 on 4 stages: groups of 4 or 5 leave a last group of 2 or 1 (a dependency bubble), 7 is
    more than the step holds, 3 fewer than the stages; only 6 takes them."""
    with pytest.raises(ValueError, match="groups"):
        order.rank_ops(p, 0, 2, m, g)
    assert order.rank_ops(p, 0, 2, m, 6)


def test_chunks_hold_equal_blocks_of_layers():
    """pipeline_layers: embedding, 8 layers, final norm, head; 4 chunks of 2 layers."""
    assert chunk_slices(8, 4) == [(0, 3), (3, 5), (5, 7), (7, 11)]


def test_the_record_prices_what_the_planner_prices_for_1f1b_with_chunks():
    mine, ref = schedules.get("interleaved"), schedules.get("1f1b")
    pipe = Pipe(4, 8, 2)
    assert mine.bubble(pipe, 0.0) == ref.bubble(pipe, 0.0) == 3 / 19
    assert mine.stored(pipe, 0, 1.0, 0.0) == ref.stored(pipe, 0, 1.0, 0.0)
    assert mine.runner == "virtual_stages"
