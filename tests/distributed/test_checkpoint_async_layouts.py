"""The cross-layout continuation of tests/distributed/test_checkpoint_layouts.py with
training.async_save=true for every run: checkpoints written and read back by asynchronous saves
continue in another layout with the losses of the source layout continuing uninterrupted
(fp32, dropout off). Three jobs, in the launches shared with the other equivalence modules (one
per world size; tests/support/launch_batches.py): 2 ranks (sources TP2 and DP2 ZeRO-2), 1 rank
(TP2 -> TP1), 4 ranks (source PP2 x DP2 ZeRO-1; DP2 ZeRO-2 -> DP4 ZeRO-1, TP2 -> TP2 x PP2).
A failure names the pair and the flavour."""
import os

import pytest

from tests.support.launch_batches import TIMEOUT_S
from tests.support.paths import ROOT

WORKER = os.path.join(ROOT, "tests", "support", "checkpoint_layouts_worker.py")
PAIRS = [("tp2", "tp1"), ("dp2_zero2", "dp4_zero1"), ("tp2", "tp2pp2")]
FLAVOURS = ["gpt2", "llama"]
TOLERANCE = 1e-5

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TIMEOUT_S)]


def _job(tmp, nproc, **lists):
    args = ["--workdir", tmp, "--set", "training.async_save=true"]
    for key, values in lists.items():
        args += [f"--{key}", ",".join(values)]
    return nproc, WORKER, args


def launches(tmp):
    """Shared with the other equivalence modules, one launch per world size
    (tests/support/launch_batches.py)."""
    return [_job(tmp, 2, sources=["tp2", "dp2_zero2"]),
            _job(tmp, 1, targets=["tp2>tp1"]),
            # A source first: the worker's targets copy on rank 0 of a joined group only.
            _job(tmp, 4, sources=["pp2dp2_zero1:gpt2"],
                 targets=["dp2_zero2>dp4_zero1", "tp2>tp2pp2"])]


@pytest.fixture(scope="module")
def results(shared_launches):
    return shared_launches.results(__name__)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("src, dst", PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
def test_an_asynchronous_checkpoint_continues_in_another_layout(results, src, dst, flavour):
    continued, reference = results[f"{src}>{dst}/{flavour}"], results[f"{src}/{flavour}"]
    assert len(continued) == len(reference) == 5
    worst = max(abs(a - b) / abs(b) for a, b in zip(continued, reference))
    assert worst <= TOLERANCE, (f"{src} -> {dst} ({flavour}), async saves: steps 6-10 "
                                f"{continued} vs uninterrupted {reference}, worst {worst:.2e}")
