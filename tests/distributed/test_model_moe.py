"""Mixture of experts with expert parallelism against one rank (docs/moe.md). Failures localize
to: the token exchange and the expert layer (the layer check: outputs and the experts' and
router's gradients of one MoE layer at EP2 against the same layer on one rank, with the same
weights, dropless and with a capacity), or a layout's composition (10 training steps, fp32, no
dropout, clipping on, against one rank: losses, gradient norms and the logged auxiliary
losses): EP under ZeRO-0, 1 and 2 (and ZeRO-3 at EP 1), over data, tensor (with and without
SP), context and pipeline parallel ranks (1F1B, ZB-H1, and two model chunks a rank:
interleaved 1F1B and ZB-V), and with full recomputation.

Three jobs (tests/support/moe_worker.py), one per world size (1, 2, 4), in the launches shared
with the other distributed modules (tests/support/launch_batches.py): start-up is the slow
part."""
import os

import pytest

from tests.support.launch_batches import TIMEOUT_S
from tests.support.moe_worker import LAYOUTS
from tests.support.paths import ROOT

WORKER = os.path.join(ROOT, "tests", "support", "moe_worker.py")
TOLERANCE = 1e-5

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TIMEOUT_S)]


def launches(tmp):
    """Each world size's layouts (2 ranks also check one MoE layer at EP2)."""
    return [(world, WORKER, ["--workdir", os.path.join(tmp, f"world{world}"), "--layouts",
                             ",".join(name for name, (w, _) in LAYOUTS.items() if w == world)])
            for world in (2, 1, 4)]


@pytest.fixture(scope="module")
def results(shared_launches):
    return shared_launches.results(__name__)


@pytest.mark.parametrize("layout", [n for n in LAYOUTS if not n.endswith("one_rank")])
def test_expert_parallel_training_matches_one_rank(results, layout):
    """Losses (language model), gradient norms (clipping on) and the routers' auxiliary losses
    of every step, against one rank (with the router bias and a shared expert, or MoE in every
    layer: its own)."""
    prefix = layout.split("_")[0] + "_" if layout.startswith(("bias_", "freq1_")) else ""
    ref = results[prefix + "one_rank"]
    got = results[layout]
    assert len(got["loss"]) == 10 and ref["loss"][-1] < ref["loss"][0] - 0.05, ref
    for key in ("loss", "grad_norm", "aux"):
        assert len(got[key]) == len(ref[key]) == 10, (key, got)
        diff = max(abs(a - b) for a, b in zip(ref[key], got[key]))
        print(f"{layout}: max {key} difference {diff:.3g}")
        assert diff < TOLERANCE, (layout, key, diff, ref[key], got[key])


@pytest.mark.parametrize("capacity", ["dropless", "capacity"])
def test_one_moe_layer_at_ep2_matches_one_rank(results, capacity):
    check = results[f"layer_{capacity}"]
    print(f"layer {capacity}: {check}")
    for key in ("output", "experts_grad", "router_grad", "input_grad"):
        assert check[key] < TOLERANCE, (key, check)
    assert (check["dropped"] > 0) == (capacity == "capacity"), check
