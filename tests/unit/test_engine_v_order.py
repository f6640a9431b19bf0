"""ZB-V's order (engine/v_order.py) and its record (config/schedules/zbv.py): the V placement,
every pass once and in micro-batch order per chunk (gradients summed in 1F1B's order), no
deadlock when every rank runs its order at once, at most 2 p chunk activations held, and the
step the record's closed form prices."""
import pytest

from megatron.config import schedules
from megatron.config.schedules.registry import Pipe
from megatron.engine import v_order as order

LAYOUTS = [(p, m) for p in (2, 3, 4, 8) for m in (1, 2, 3, 4, 8, 16)]


def test_the_v_placement():
    """Rank r holds chunks r and 2p - 1 - r: rank 0 the first and the last, rank p - 1 the two
    middle ones."""
    assert [[order.model_chunk(4, r, c) for c in (0, 1)] for r in range(4)] == \
        [[0, 7], [1, 6], [2, 5], [3, 4]]
    for chunk in range(8):
        rank, local = order.owner(4, chunk)
        assert order.model_chunk(4, rank, local) == chunk


@pytest.mark.parametrize("p,m", LAYOUTS)
def test_every_pass_once_in_micro_batch_order_per_chunk(p, m):
    for r in range(p):
        ops = order.rank_ops(p, r, 2, m)
        assert len(ops) == 6 * m and len(set(ops)) == len(ops)
        at = {op: i for i, op in enumerate(ops)}
        for local in (0, 1):
            for kind in (order.F, order.B, order.W):
                assert [mb for k, c, mb in ops if k == kind and c == local] == list(range(m))
            for mb in range(m):
                assert at[(order.F, local, mb)] < at[(order.B, local, mb)] < \
                    at[(order.W, local, mb)]


@pytest.mark.parametrize("p,m", LAYOUTS)
def test_no_deadlock_and_at_most_2p_chunk_activations(p, m):
    order.replay(p, m)  # raises on a deadlock
    for r in range(p):
        held = peak = 0
        for kind, _, _ in order.rank_ops(p, r, 2, m):
            held += {order.F: 1, order.B: 0, order.W: -1}[kind]
            peak = max(peak, held)
        assert peak <= 2 * p


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_the_step_is_the_records_within_one_chunk_pass(p, k):
    """F = B = W = 1 a chunk pass: m (F + B + W) = 6 m of work a rank, and the record's idle
    (p - 1) F / 2 of a stage's F = p - 1 chunk passes; reached at m = p, at most one pass more
    beyond."""
    m = k * p
    step = order.replay(p, m)
    closed = 6 * m + (p - 1)
    assert closed <= step <= closed + 1
    bubble = schedules.get("zbv").bubble(Pipe(p, m, 2), 1 / 3)
    assert bubble == pytest.approx((p - 1) / closed)
    if m == p:
        assert step == closed


def test_it_beats_1f1b_and_zbh1_at_the_same_micro_batches():
    for p, m in [(4, 4), (4, 8), (8, 16)]:
        pipe = Pipe(p, m)
        zbv = schedules.get("zbv").bubble(Pipe(p, m, 2), 1 / 3)
        assert zbv < schedules.get("zbh1").bubble(pipe, 1 / 3) < \
            schedules.get("1f1b").bubble(pipe, 0.0)


def test_the_record():
    record = schedules.get("zbv")
    assert record.runner == "v_stages" and record.split_backward
    assert record.rule(4, 1, 2) is None
    assert record.rule(4, 1, 3).field == "parallel.virtual_pipeline_size"
    assert record.rule(1, 1, 2).field == "parallel.pipeline_schedule"
    # every stage holds the first stage's 1F1B peak: p micro-batches of a stage
    assert record.stored(Pipe(4, 8, 2), 3, 1.0, 0.5) == 4.0
    with pytest.raises(ValueError, match="2 chunks"):
        order.rank_ops(4, 0, 3, 8)
