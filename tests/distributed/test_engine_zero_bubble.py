"""The zero-bubble ZB-H1 schedule against DeepSpeed's 1F1B on real ranks (gloo): every case is
trained twice in one launch, once per schedule, on the same micro-batches. fp32 must give the
same per-step losses and gradient norms bit for bit (ZB-H1 only reorders the passes and moves
the weight-gradient GEMMs; the sums run in the same order); bf16 within BF16_BOUND.

Two jobs, in the launches shared with the other distributed modules (one per world size:
tests/support/launch_batches.py): 2 ranks (PP2: ZeRO-1 and ZeRO-0, bf16, full and selective
recomputation) and 4 ranks (PP4, TP2 x PP2, TP2 x PP2 with sequence parallelism). A failure
names the case, so it localizes to TP, SP, precision, recomputation or the number of stages."""
import os

import pytest

from megatron.engine import pipe_order
from tests.support.launch_batches import TIMEOUT_S
from tests.support.paths import ROOT

WORKER = os.path.join(ROOT, "tests", "support", "zero_bubble_worker.py")
EXACT_TWO = ["pp2-gpt2", "pp2-llama", "pp2_zero0-gpt2", "pp2_recompute_full-gpt2",
             "pp2_recompute_selective-llama"]
BF16 = ["pp2_bf16-gpt2", "pp2_bf16-llama"]
EXACT_FOUR = ["pp4-gpt2", "pp4-llama", "tp2pp2-gpt2", "tp2pp2-llama", "tp2pp2_sp-gpt2"]
# The bf16 weight gradients are the same bf16 products in the same order, accumulated into the
# same fp32 buffers; measured identical here. The bound allows for a reordering of bf16 rounding
# that another torch might bring.
BF16_BOUND = 1e-3
STEPS = 4

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TIMEOUT_S)]


def launches(tmp):
    """Each case under 1F1B and ZB-H1, 2 ranks then 4."""
    def job(nproc, cases):
        return nproc, WORKER, ["--cases", ",".join(cases), "--workdir", tmp, "--steps", str(STEPS)]
    return [job(2, EXACT_TWO + BF16), job(4, EXACT_FOUR)]


@pytest.fixture(scope="module")
def results(shared_launches):
    return shared_launches.results(__name__)


@pytest.mark.parametrize("case", EXACT_TWO + EXACT_FOUR)
def test_zbh1_is_bit_identical_to_1f1b(results, case):
    ref, got = results[case]["1f1b"], results[case]["zbh1"]
    assert got["deferred_layers"] > 0 and got["b_passes_last_step"] == 8, got
    assert got["w_pending"] == 0, f"{case}: W passes left after the optimizer step"
    assert got["losses"] == ref["losses"], f"{case}: {got['losses']} vs {ref['losses']}"
    assert got["grad_norms"] == ref["grad_norms"], case
    assert got["losses"][-1] < got["losses"][0], f"{case}: does not learn"


@pytest.mark.parametrize("case", BF16)
def test_zbh1_bf16_within_bound(results, case):
    ref, got = results[case]["1f1b"]["losses"], results[case]["zbh1"]["losses"]
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    print(f"{case}: worst relative loss difference {worst:.2e}")
    assert worst <= BF16_BOUND, f"{case}: {got} vs {ref}"


@pytest.mark.parametrize("p,m", [(2, 4), (2, 16), (4, 8), (4, 16), (8, 16)])
def test_schedule_order_without_w_is_deepspeeds(p, m):
    """zbh1 keeps DeepSpeed's TrainSchedule for everything but W, W after its B, all W before
    the step ends, and at most p micro-batches held per stage (1F1B's peak)."""
    from deepspeed.runtime.pipe import schedule as ds
    from megatron.engine.zero_bubble import BackwardWeightPass, ZeroBubbleSchedule
    names = {ds.ForwardPass: "F", ds.BackwardPass: "B", ds.LoadMicroBatch: "LOAD",
             ds.SendActivation: "SA", ds.RecvActivation: "RA", ds.SendGrad: "SG",
             ds.RecvGrad: "RG"}
    for s in range(p):
        theirs = [[repr(c) for c in step] for step in ds.TrainSchedule(m, p, s).steps()]
        ours = [[repr(c) for c in step if not isinstance(c, BackwardWeightPass)]
                for step in ZeroBubbleSchedule(m, p, s).steps()]
        assert ours == theirs, f"p={p} stage {s}"
        ops = pipe_order.stage_ops("zbh1", p, s, m)
        b_at = {mb: i for i, (op, mb) in enumerate(ops) if op == "B"}
        w_at = {mb: i for i, (op, mb) in enumerate(ops) if op == "W"}
        assert sorted(w_at) == list(range(m)) and all(w_at[k] > b_at[k] for k in range(m))
        assert pipe_order.peak_held("zbh1", p, s, m) <= p
        assert names  # every DeepSpeed instruction above is one of these


@pytest.mark.parametrize("p,m", [(2, 4), (2, 16), (4, 8), (8, 16), (8, 64)])
def test_bubble_is_a_third_of_1f1bs(p, m):
    """With F = B = W the step is 3m + p - 1 passes long, against 1F1B's 3(m + p - 1), and the
    blocking sends never deadlock."""
    ones = [{"F": 1.0, "B": 1.0, "W": 1.0}] * p
    full = [{"F": 1.0, "B": 2.0}] * p
    assert pipe_order.makespan("1f1b", p, m, full) == 3 * (m + p - 1)
    assert pipe_order.makespan("zbh1", p, m, ones) == 3 * m + p - 1
