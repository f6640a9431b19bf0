"""Who is named a straggler (training/stragglers.py): each rank against the median of the others,
above training.straggler_factor in two windows in a row; the process test with a real delay is
tests/integration/test_training_stragglers.py."""
import time
from types import SimpleNamespace

import torch

from megatron.engine.engine import ComputeTimer
from megatron.training.stragglers import Stragglers


def _stragglers(ranks):
    t = SimpleNamespace(straggler_interval=10, straggler_factor=1.2)
    return Stragglers(t, None, False, torch.device("cpu"), [f"n{i}" for i in range(ranks)], None)


def _judge(seconds):
    """The same window twice: what is named the second time."""
    s = _stragglers(len(seconds))
    assert s._name(10, seconds) == []  # one window is not enough
    return [(e.rank, e.host, e.ratio) for e in s._name(20, seconds)]


def test_the_slow_rank_is_named_against_the_others():
    assert _judge([1.0, 1.3]) == [(1, "n1", 1.3)]  # of two ranks: against the other one
    assert _judge([1.0, 1.02, 0.98, 1.5, 1.01]) == [(3, "n3", 1.493)]
    assert _judge([1.0, 1.1, 0.95, 1.05]) == []  # an even run
    assert _judge([0.0, 0.0]) == []  # nothing measured (pipeline parallel)


def test_only_a_rank_slow_in_two_windows_in_a_row_is_named():
    s = _stragglers(3)
    assert s._name(10, [1.0, 1.5, 1.0]) == []  # rank 1: a stretch of contention
    assert s._name(20, [1.0, 1.0, 1.5]) == []  # now rank 2: still no one twice
    assert s._name(30, [1.0, 1.0, 1.4]) != []  # rank 2 again
    assert [(e.step, e.rank, e.ratio) for e in s._name(40, [1.0, 1.0, 1.3])] == [(40, 2, 1.3)]
    assert s._name(50, [1.0, 1.0, 1.0]) == [] and s._name(60, [1.0, 1.0, 1.3]) == []


def test_pipeline_runs_are_not_judged():
    t = SimpleNamespace(straggler_interval=10, straggler_factor=1.2)
    assert Stragglers(t, None, True, torch.device("cpu"), ["n0"], None).interval == 0


def test_the_timer_gives_the_median_span_so_one_pause_names_no_one():
    timer = ComputeTimer(torch.device("cpu"))
    assert timer.take() == 0.0  # nothing measured
    for pause in (0.002, 0.002, 0.002, 0.002, 0.2):  # one forward held up by a long pause
        timer.start()
        time.sleep(pause)
        timer.stop()
    median = timer.take()
    assert 0.002 <= median < 0.05, median  # the sum (0.208 s) would be 26x a plain window
    assert timer.take() == 0.0  # a new window
