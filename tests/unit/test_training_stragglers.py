"""Who is named a straggler (training/stragglers.py): each rank against the median of the others,
above training.straggler_factor; the process test with a real delay is
tests/integration/test_training_stragglers.py."""
from types import SimpleNamespace

import torch

from megatron.engine.engine import ComputeTimer
from megatron.training.stragglers import Stragglers


def _judge(seconds, factor=1.2):
    t = SimpleNamespace(straggler_interval=10, straggler_factor=factor)
    s = Stragglers(t, None, False, torch.device("cpu"), [f"n{i}" for i in range(len(seconds))],
                   None)
    return [(e.rank, e.host, e.ratio) for e in s._name(10, seconds)]


def test_the_slow_rank_is_named_against_the_others():
    assert _judge([1.0, 1.3]) == [(1, "n1", 1.3)]  # of two ranks: against the other one
    assert _judge([1.0, 1.02, 0.98, 1.5, 1.01]) == [(3, "n3", 1.493)]
    assert _judge([1.0, 1.1, 0.95, 1.05]) == []  # an even run
    assert _judge([0.0, 0.0]) == []  # nothing measured (pipeline parallel)


def test_pipeline_runs_are_not_judged_and_the_timer_sums_spans():
    t = SimpleNamespace(straggler_interval=10, straggler_factor=1.2)
    assert Stragglers(t, None, True, torch.device("cpu"), ["n0"], None).interval == 0
    timer = ComputeTimer(torch.device("cpu"))
    for _ in range(3):
        timer.start()
        timer.stop()
    first = timer.take()
    assert first >= 0 and timer.take() == 0.0
