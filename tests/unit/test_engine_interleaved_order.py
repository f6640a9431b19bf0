"""The interleaved 1F1B order (engine/interleaved_order.py) and the interleaved schedule's
record; the config rules of parallel.virtual_pipeline_size are in test_config_interleaving.py."""
import pytest

from megatron.config import schedules
from megatron.config.schedules.registry import Pipe
from megatron.engine import interleaved_order as order
from megatron.engine.chunks import chunk_slices

LAYOUTS = [(2, 1, 4), (2, 2, 4), (2, 2, 8), (4, 2, 8), (4, 2, 16), (4, 4, 4), (8, 2, 16),
           (2, 3, 6)]


@pytest.mark.parametrize("p,v,m", LAYOUTS)
def test_every_chunk_pass_once_forward_before_backward(p, v, m):
    every = set()
    for r in range(p):
        ops = order.rank_ops(p, r, v, m)
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


@pytest.mark.parametrize("p,v,m", LAYOUTS)
def test_dependencies_hold_and_the_bubble_shrinks_by_v(p, v, m):
    """Replayed on every rank at once (sends never block, receives wait): no deadlock, and with
    a chunk forward of 1/v and backward of 2/v a stage's, the step takes
    m (F + B) + (p - 1)(F + B)/v: the bubble (p - 1)/(v m + p - 1) of the record."""
    step = order.replay(p, v, m, [{order.F: 1.0 / v, order.B: 2.0 / v}] * p)
    assert step == pytest.approx(3 * m + 3 * (p - 1) / v)
    bubble = schedules.get("interleaved").bubble(Pipe(p, m, v), 0.0)
    assert (step - 3 * m) / step == pytest.approx(bubble)


def test_warmup_is_megatrons():
    assert [order.warmup(4, r, 2, 8) for r in range(4)] == [10, 8, 6, 4]
    assert order.warmup(4, 0, 2, 4) == 8  # m = p: every forward first
    assert [order.warmup(4, r, 1, 8) for r in range(4)] == [3, 2, 1, 0]


def test_micro_batches_in_multiples_of_stages():
    with pytest.raises(ValueError, match="multiples"):
        order.rank_ops(4, 0, 2, 6)


def test_chunks_hold_equal_blocks_of_layers():
    """pipeline_layers: embedding, 8 layers, final norm, head; 4 chunks of 2 layers."""
    assert chunk_slices(8, 4) == [(0, 3), (3, 5), (5, 7), (7, 11)]


def test_the_record_prices_what_the_planner_prices_for_1f1b_with_chunks():
    mine, ref = schedules.get("interleaved"), schedules.get("1f1b")
    pipe = Pipe(4, 8, 2)
    assert mine.bubble(pipe, 0.0) == ref.bubble(pipe, 0.0) == 3 / 19
    assert mine.stored(pipe, 0, 1.0, 0.0) == ref.stored(pipe, 0, 1.0, 0.0)
    assert mine.runner == "virtual_stages"
