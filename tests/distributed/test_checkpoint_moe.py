"""Checkpoints of experts split over expert-parallel ranks (docs/moe.md): a run saved at step 5
at EP4 (4 ranks, ZeRO-0 and ZeRO-1) continues to step 10 at EP2 (2 ranks, ZeRO-1 and ZeRO-0) and
on one process; one saved at EP2 x TP2 (SP) x DP2 continues at EP2 x TP2 x PP2, at EP2 x TP2 x
PP2 in ZB-V's model chunks and on one process; one saved from ZB-V's chunks at EP2 x PP2
continues on one process. Steps 6-10 must match the uninterrupted source run. The EP4 run
merged to one file (megatron-convert to-single) starts EP2 and one process from the same
weights (checkpoint.init_from: each rank takes its experts' slice). The checkpoint
stores each expert tensor on its global expert axis [E, ...] (checkpoint/experts.py), with the
fp32 masters and Adam moments, so any expert-parallel size reads its own experts' range. fp32,
dropless, no dropout.

Three jobs (tests/support/moe_checkpoint_worker.py), 4 ranks, then 2, then 1, each continuing
what the one before wrote, in the launches shared with the other distributed modules
(tests/support/launch_batches.py: the 4-rank job runs in the first round, the others in the
second)."""
import os

import pytest

from tests.support.launch_batches import TIMEOUT_S
from tests.support.paths import ROOT

WORKER = os.path.join(ROOT, "tests", "support", "moe_checkpoint_worker.py")
LAUNCHES = {4: ("ep4_zero0,ep4_zero1,ep2_tp2_dp2,ep2_pp2_zbv",
                "ep2_tp2_dp2>ep2_tp2_pp2,ep2_tp2_dp2>ep2_tp2_pp2_zbv"),
            2: ("", "ep4_zero0>ep2_zero1,ep4_zero1>ep2_zero0"),
            1: ("", "ep4_zero1>one,ep4_zero0>one,ep2_tp2_dp2>one_bias,ep2_pp2_zbv>one_bias")}
# megatron-convert to-single of the EP4 run (written by the 4-rank launch), then a fresh run
# from it (checkpoint.init_from) at EP2 and on one process: each rank takes its experts' slice
SINGLE = "ep4_zero1"
INITS = {2: "ep2_zero1", 1: "one"}
TOLERANCE = 1e-5

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TIMEOUT_S)]


def launches(tmp):
    """4 ranks save the sources (and merge one to a single file); 2 ranks, then 1, continue."""
    jobs = []
    for world in (4, 2, 1):
        sources, targets = LAUNCHES[world]
        extra = ["--single", SINGLE] if world == 4 else ["--inits", f"{SINGLE}:{INITS[world]}"]
        jobs.append((world, WORKER, ["--workdir", tmp, "--sources", sources,
                                     "--targets", targets, *extra]))
    return jobs


@pytest.fixture(scope="module")
def results(shared_launches):
    return shared_launches.results(__name__)


@pytest.mark.parametrize("case", [t for w in (4, 2, 1) for t in LAUNCHES[w][1].split(",")])
def test_moe_checkpoint_continues_at_another_expert_parallel_size(results, case):
    src = case.split(">")[0]
    ref, got = results[src], results[case]
    assert len(got) == 5 and len(ref) == 5, (ref, got)
    diff = max(abs(a - b) for a, b in zip(ref, got))
    print(f"{case}: steps 6-10 max loss difference {diff:.3g}")
    assert diff < TOLERANCE, (case, diff, ref, got)


def test_a_single_file_of_split_experts_starts_any_expert_parallel_size(results):
    """The EP4 run merged to one file starts fresh runs at EP2 (2 ranks) and on one process from
    the same weights: their first losses (the same first batch) agree, and are below the
    untrained model's first loss on that batch."""
    ep2, one = (results[f"{SINGLE}:{INITS[w]}"] for w in (2, 1))
    fresh = results[f"{SINGLE}/first"]
    print(f"first loss from the single file: EP2 {ep2}, one process {one}, fresh {fresh}")
    assert abs(ep2 - one) <= 1e-5 * one, (ep2, one)
    assert one < fresh - 0.05, (one, fresh)
