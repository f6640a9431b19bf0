"""The training state's invariants on 4 CPU ranks (training/state_check.py, issue 40 item 4):
in each case the test hook flips an exponent of one rank's AdamW moments, weights or reduced
gradients in one step (tests/support/state_check_worker.py), and the run must stop in that very
step naming that rank, with no checkpoint of the step although every step is saved: ZeRO-0's
reduced gradients (three replicas outvote the fourth), ZeRO-1's weights, ZeRO-2's and ZeRO-3's
moment shards, bf16's fp32 moments, a TP2 x PP2 pipeline's moments; and TP2 x DP2, where two
replicas disagree and both are named as suspects with no node called bad. That healthy runs pass
is every other distributed test's business: they all run with the check on (its default).

One job in the 4-rank launch shared with the equivalence modules (tests/support/launch_batches.py)."""
import os

import pytest

from tests.support.launch_batches import TIMEOUT_S
from tests.support.paths import ROOT

WORKER = os.path.join(ROOT, "tests", "support", "state_check_worker.py")
# case: (rank named, step, what the finding says, known to be the faulty one)
EXPECT = {
    "grad_zero0_dp4": ([2], 2, "checksum", True),
    "param_zero1_dp4": ([1], 3, "checksum", True),
    "exp_avg_zero2_dp4": ([3], 2, "Adam moments", True),
    "exp_avg_sq_zero3_dp4": ([0], 3, "Adam moments", True),
    "exp_avg_bf16_dp4": ([1], 2, "Adam moments", True),
    "exp_avg_tp2pp2": ([3], 2, "Adam moments", True),
    "param_tp2dp2_zero0": ([1, 3], 2, "checksum", False),
}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TIMEOUT_S)]


def launches(tmp):
    return [(4, WORKER, ["--workdir", tmp, "--cases", ",".join(EXPECT)])]


@pytest.fixture(scope="module")
def results(shared_launches):
    return shared_launches.results(__name__)


@pytest.mark.parametrize("case", list(EXPECT))
def test_a_corrupted_state_stops_the_run_in_its_step_naming_the_rank(results, case):
    ranks, step, what, known = EXPECT[case]
    got = results[case]
    assert got["error"] is not None and got["losses"] is None, f"{case}: the run did not stop"
    assert f"step {step}: the training state broke an invariant" in got["error"], got["error"]
    events = got["events"]
    assert [(e["rank"], e["step"], e["known"]) for e in events] == \
        [(r, step, known) for r in ranks], events
    assert all(what in e["what"] for e in events), events
    # saved every step: the newest complete checkpoint is the step before the corrupted one
    assert got["checkpoint_step"] == step - 1, got["checkpoint_step"]
    hosts = sorted({e["host"] for e in events})
    assert got["bad_nodes"] == (hosts if known else []), got["bad_nodes"]
