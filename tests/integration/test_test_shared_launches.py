"""The shared launches of the distributed tests (tests/support/launch_batches.py and
shared_launch.py), with a stand-in worker (tests/support/echo_worker.py) in plain one-rank
launches: several modules' jobs run in one launch, each job imports its worker anew, a module
reads its own jobs' results merged, a failed job fails its module alone (with the worker's
error) and the jobs after it still run in a new launch, and a module must list its jobs in the
launch order."""
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


def test_a_module_lists_its_jobs_in_the_launch_order(tmp_path):
    batches = Batches(str(tmp_path), {"a": lambda tmp: [(1, ECHO, []), (2, ECHO, [])]})
    with pytest.raises(AssertionError, match="must come in the world order"):
        batches.results("a")
    with pytest.raises(AssertionError, match="could not run(.|\n)*must come in the world order"):
        batches.results("a")  # asked again, the same error, not a second try
