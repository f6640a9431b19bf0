"""A run leaves no process group behind it (issue 40 item 10's class: a run's gloo groups
outliving it): one 2-rank process trains runs of every kind of group one after another, as a
sweep or a notebook would (PP2 under 1F1B, ZB-H1 and interleaving, TP2, DP2 under ZeRO-1 and
ZeRO-3, Ulysses CP2, EP2), and its gloo threads after each run must not grow, on any rank;
then two jobs alive at once, the first closed first. Before Job.close destroyed the groups a
run created, each PP2 run left 8 groups alive (24 gloo threads, 37 file descriptors per rank)
until the process ended, TP2 and ZeRO-1 2 each; each ZeRO-3 run left its
whole model and two groups, held by DeepSpeed's class-wide cache of released parameters; and a
pipeline's last stage kept its engine, model and groups through the last micro-batches' outputs
and loss, whose backward hooks hold the engine (engine/engine.py _drop_graphs).

One job in the 2-rank launch shared with the equivalence modules
(tests/support/launch_batches.py)."""
import os

import pytest

from tests.support.launch_batches import TIMEOUT_S
from tests.support.paths import ROOT

WORKER = os.path.join(ROOT, "tests", "support", "groups_left_worker.py")
LAYOUTS = ["pp2", "pp2", "tp2", "dp2_zero1", "dp2_zero3", "pp2_zbh1", "dp2_zero3", "cp2", "ep2",
           "pp2v2", "pp2"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TIMEOUT_S)]


def launches(tmp):
    return [(2, WORKER, ["--workdir", tmp, "--layouts", ",".join(LAYOUTS)])]


@pytest.fixture(scope="module")
def results(shared_launches):
    return shared_launches.results(__name__)


def test_runs_after_runs_hold_no_more_gloo_threads(results):
    after = results["gloo_threads_after"]
    assert [layout for layout, _ in after] == LAYOUTS
    first = after[0][1]  # per rank
    for layout, threads in after[1:]:
        assert threads == first, f"gloo threads after each run, by rank: {after} (grew after " \
                                 f"{layout})"


def test_jobs_alive_at_once_close_in_any_order(results):
    """Two PP2 jobs alive at once (an A/B comparison stepping two engines in turn), the first
    closed first. Before: its close ended the second's groups and DeepSpeed's pipeline grid (the
    second's next step failed: 'NoneType' object has no attribute 'get_stage_id'), the second's
    record of the groups before it held the first's (24 gloo threads a rank) until it closed,
    and the first's model was never collected (the second's start had frozen it)."""
    for rank, seen in enumerate(results["overlap"]):
        none, one, both, after_first, after_both = seen["gloo_threads"]
        assert none < one < both, seen
        assert (after_first, after_both) == (one, none), f"rank {rank}: gloo threads with no " \
            f"job, one, both, after the first's close, after both: {seen['gloo_threads']}"
        assert not seen["first_model_outlived_close"], f"rank {rank}: the first job's model " \
                                                       f"outlived its close"
        first, second = seen["losses"]  # the same model, data and seed: the same first step
        assert first == second and 0 < first < 20, seen["losses"]
