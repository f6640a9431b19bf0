"""The shared launches of the distributed tests (tests/support/launch_batches.py and
shared_launch.py), with a stand-in worker (tests/support/echo_worker.py) in plain one-rank
launches: several modules' jobs run in one launch, each job imports its worker anew, a module
reads its own jobs' results merged, a failed job fails its module alone (with the worker's
error) and the jobs after it still run in a new launch; a job of an earlier world size than the
one before it starts its module's next round; a failure shows what each rank said of it."""
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
                       r"(.|\n)*echo_worker failed as asked \(b2\)"
                       r"(.|\n)*and on the first try:(.|\n)*failed as asked \(b2\)"):
        batches.results("b")
    # one launch ran a1, a2, b1 and stopped at b2; a second ran c1 (b3: b had already failed);
    # then b, whole and alone, once more: b1, and b2 fails again
    assert [line.split(":")[0] for line in batches.log] == ["1 rank(s), 6 job(s)",
                                                            "1 rank(s), 1 job(s)",
                                                            "1 rank(s), 3 job(s)"]
    assert os.path.exists(os.path.join(str(tmp_path), "b-try2"))


def test_a_module_that_passes_on_its_second_try_is_named(tmp_path):
    """The first try of the module's job fails (a marker file is missing), the second passes:
    the module's results are the second try's, and the log names the first failure."""
    flag = tmp_path / "once"
    batches = Batches(str(tmp_path), {"m": _echo(["--value", "m1", "--fail-once", str(flag)])})
    assert batches.results("m") == {"m1": {"runs_in_this_import": 1}}
    retried = [line for line in batches.log if "SECOND TRY" in line]
    assert len(retried) == 1 and "failed once as asked" in retried[0], batches.log


def test_a_failure_names_each_ranks_own_cause(tmp_path):
    """Rank 1 raises while rank 0 hangs (on both tries): the error shows rank 1's traceback and the stack the
    launcher's SIGTERM found rank 0 in, each under its rank, ahead of the interleaved stderr."""
    batches = Batches(str(tmp_path), {"m": lambda tmp: [(2, ECHO, ["--fail-rank", "1"])]})
    with pytest.raises(AssertionError) as failed:
        batches.results("m")
    said = str(failed.value)
    rank0, rank1 = said.index("--- rank 0 ---"), said.index("--- rank 1 ---")
    assert "echo_worker.py\", line" in said[rank0:rank1]  # where SIGTERM found it
    assert "echo_worker failed as asked" in said[rank1:said.index("--- the launch's stderr")]


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
