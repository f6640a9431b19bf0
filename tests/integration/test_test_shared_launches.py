"""The shared launches of the distributed tests (tests/support/launch_batches.py and
shared_launch.py), with a stand-in worker (tests/support/echo_worker.py) in plain one-rank
launches: several modules' jobs run in one launch, each job imports its worker anew, a module
reads its own jobs' results merged, a failed job fails its module alone (with the worker's
error) and the jobs after it still run in a new launch; a job of an earlier world size than the
one before it starts its module's next round."""
import os

import pytest

from tests.support.launch_batches import Batches
from tests.support.paths import ROOT

ECHO = os.path.join(ROOT, "tests", "support", "echo_worker.py")

pytestmark = pytest.mark.slow  # three plain python launches that import torch


def _echo(*args):
    return lambda tmp: [(1, ECHO, [*a]) for a in args]


def test_modules_share_a_launch_and_a_failure_stays_in_its_module(tmp_path):
    batches = Batches(str(tmp_path), {
        "a": _echo(["--value", "a1"], ["--value", "a2"]),
        "b": _echo(["--value", "b1"], ["--value", "b2", "--fail"], ["--value", "b3"]),
        "c": _echo(["--value", "c1"]),
    })
    assert batches.results("a") == {"a1": {"runs_in_this_import": 1},
                                    "a2": {"runs_in_this_import": 1}}
    assert batches.results("c") == {"c1": {"runs_in_this_import": 1}}
    with pytest.raises(AssertionError, match=r"b#1 \(echo_worker, 1 rank\(s\)\) failed"
                       r"(.|\n)*echo_worker failed as asked \(b2\)"):
        batches.results("b")
    # one launch ran a1, a2, b1 and stopped at b2; a second ran c1 (b3: b had already failed)
    assert [line.split(":")[0] for line in batches.log] == ["1 rank(s), 6 job(s)",
                                                            "1 rank(s), 1 job(s)"]


def test_a_job_of_an_earlier_world_size_starts_the_modules_next_round(tmp_path):
    """A checkpoint of 4 ranks continued on 2, then on 1: the jobs after the 4-rank one go to a
    second round, which runs after every module's first; a world size outside the launch
    order is refused."""
    batches = Batches(str(tmp_path), {
        "chain": lambda tmp: [(2, ECHO, []), (1, ECHO, []), (4, ECHO, []), (2, ECHO, []),
                              (1, ECHO, []), (8, ECHO, []), (4, ECHO, [])],
        "plain": lambda tmp: [(1, ECHO, []), (4, ECHO, [])]})
    rounds = {(j.module, j.index): (j.ranks, j.round) for j in batches._jobs()}
    assert [rounds["chain", i] for i in range(7)] == [(2, 0), (1, 0), (4, 0), (2, 1), (1, 1),
                                                     (8, 1), (4, 2)]
    assert [rounds["plain", i] for i in range(2)] == [(1, 0), (4, 0)]
    bad = Batches(str(tmp_path), {"a": lambda tmp: [(3, ECHO, [])]})
    with pytest.raises(AssertionError, match="3 ranks is not in"):
        bad._jobs()
