"""Any checkpoint continues in any valid layout of the same model, with its whole training state:
train 5 steps in layout X, save, continue steps 6-10 in layout Y; the losses equal those of X
continuing uninterrupted (fp32, dropout off). Weights alone would not do: with Adam moments,
fp32 masters, the step count, the schedule or the data position lost, step 6 already differs.

Three jobs, in the launches shared with the other equivalence modules (one per world size:
start-up dominates; tests/support/launch_batches.py): 2 ranks (sources TP2, DP2 ZeRO-2, the
bf16 case, PP2 under interleaved 1F1B, ZB-V and 1F1B; continuations between them), 1 rank
(source TP1; TP2 -> TP1, interleaved and ZB-V -> one process), 4 ranks (source PP2xDP2 ZeRO-1;
continuations on 4 ranks, interleaved -> PP4).
A failure names the pair and the flavour: a wrong partition of one kind of weight (fused QKV,
SwiGLU's stride, row/column, padded vocabulary) shows on one flavour or one pair only."""
import os

import pytest

from tests.support.exactness import assert_same_arithmetic
from tests.support.launch_batches import TIMEOUT_S
from tests.support.paths import ROOT

WORKER = os.path.join(ROOT, "tests", "support", "checkpoint_layouts_worker.py")
PAIRS = [("tp2", "tp1"), ("tp1", "tp2pp2"), ("pp2dp2_zero1", "tp2dp2_zero3"),
         ("dp2_zero2", "dp4_zero1"),
         # uneven stages (1 + 3 layers) onto even ones and onto one process
         ("pp2_first1", "pp2"), ("pp2_first1", "tp1")]
FLAVOURS = ["gpt2", "llama"]
TOLERANCE = 1e-5
# Interleaved 1F1B (pp2v2: rank r holds layers r and r + 2) and ZB-V (pp2zbv: rank 0 layers 0
# and 3 and both copies of the tied embedding) run 1F1B's arithmetic bit for bit
# (tests/distributed/test_engine_interleaved.py) and their checkpoints name each layer by its
# global number, as every layout does: between them and 1F1B on the same stages a
# continuation is exact but for the gradient norm's grouping over the ranks
# (tests/support/exactness.py: bit for bit until a step is clipped with norms an ulp apart);
# onto other stages or one process it is held to TOLERANCE.
EXACT = [("pp2v2", "pp2"), ("pp2", "pp2v2"), ("pp2zbv", "pp2")]
INTERLEAVED = [("pp2v2", "pp4"), ("pp2v2", "tp1"), ("pp2zbv", "tp1")]
# bf16 (DP2 ZeRO-1, DeepSpeed's ZeRO optimizer) -> TP2 ZeRO-0 (its BF16_Optimizer): the fp32
# masters carry over exactly, but TP splits each bf16 matmul's reduction differently.
BF16_TOLERANCE = 2e-3
# fp32 gradient accumulation (training.grad_accum_dtype=fp32, DeepSpeed's BF16_Optimizer at
# ZeRO-1) resumed as itself (exact: its fp32 masters, moments and step all restored), and to and
# from bf16 accumulation under ZeRO-1's own optimizer (the same masters; the gradients rounded
# once more to bf16 on one side).
BF16_ACCUMULATION = ["dp2_zero1_bf16acc>dp2_zero1_bf16acc", "dp2_zero1_bf16acc>dp2_zero1_bf16",
                     "dp2_zero1_bf16>dp2_zero1_bf16acc"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TIMEOUT_S)]


def _job(tmp, nproc, **lists):
    args = ["--workdir", tmp]
    for key, values in lists.items():
        args += [f"--{key}", ",".join(values)]
    return nproc, WORKER, args


def launches(tmp):
    """Shared with the other equivalence modules, one launch per world size
    (tests/support/launch_batches.py): 2 ranks' sources first, then 1 rank (TP1's source, and
    TP2's, interleaved and ZB-V checkpoints continued), then 4 (continuations of the 1- and
    2-rank sources)."""
    return [_job(tmp, 2, sources=["tp2", "dp2_zero2", "dp2_zero1_bf16:gpt2",
                                  "dp2_zero1_bf16acc:gpt2", "pp2v2", "pp2", "pp2zbv",
                                  "pp2_first1"],
                 targets=["dp2_zero1_bf16>tp2_zero0_bf16:gpt2", "pp2v2>pp2", "pp2>pp2v2",
                          "pp2zbv>pp2", "pp2_first1>pp2",
                          *(f"{pair}:gpt2" for pair in BF16_ACCUMULATION)]),
            _job(tmp, 1, sources=["tp1"], targets=["tp2>tp1", "pp2v2>tp1", "pp2zbv>tp1",
                                                   "pp2_first1>tp1"]),
            _job(tmp, 4, sources=["pp2dp2_zero1"],
                 targets=["tp1>tp2pp2", "dp2_zero2>dp4_zero1", "pp2dp2_zero1>tp2dp2_zero3",
                          "pp2v2>pp4"])]


@pytest.fixture(scope="module")
def results(shared_launches):
    return shared_launches.results(__name__)


def _worst(losses, reference):
    assert len(losses) == len(reference) == 5
    return max(abs(a - b) / abs(b) for a, b in zip(losses, reference))


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("src, dst", PAIRS + INTERLEAVED,
                         ids=[f"{a}-to-{b}" for a, b in PAIRS + INTERLEAVED])
def test_continuing_in_another_layout_matches_continuing_in_the_same(results, src, dst, flavour):
    continued = results[f"{src}>{dst}/{flavour}"]
    reference = results[f"{src}/{flavour}"]
    worst = _worst(continued, reference)
    assert worst <= TOLERANCE, (f"{src} -> {dst} ({flavour}): steps 6-10 {continued} vs "
                                f"uninterrupted {reference}, worst relative {worst:.2e}")


def test_bf16_continues_in_another_layout_within_its_bound(results):
    continued = results["dp2_zero1_bf16>tp2_zero0_bf16/gpt2"]
    reference = results["dp2_zero1_bf16/gpt2"]
    assert _worst(continued, reference) <= BF16_TOLERANCE, (continued, reference)


@pytest.mark.parametrize("pair", BF16_ACCUMULATION)
def test_fp32_gradient_accumulation_resumes_and_changes_to_and_from_bf16(results, pair):
    src, dst = pair.split(">")
    continued, reference = results[f"{pair}/gpt2"], results[f"{src}/gpt2"]
    bound = TOLERANCE if src == dst else BF16_TOLERANCE
    assert _worst(continued, reference) <= bound, (pair, continued, reference)
    if src != dst:  # the two accumulations are different runs, not the same one twice
        assert results["dp2_zero1_bf16acc/gpt2"] != results["dp2_zero1_bf16/gpt2"]


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("src, dst", EXACT, ids=[f"{a}-to-{b}" for a, b in EXACT])
def test_interleaved_and_1f1b_continue_each_other_bit_for_bit(results, src, dst, flavour):
    """A failure here and not in test_engine_interleaved.py: the checkpoint (names, the tied
    embedding's copy on the last stage, optimizer state) is what differs."""
    key, ref_key = f"{src}>{dst}/{flavour}", f"{src}/{flavour}"
    got, ref = results[f"{key}/norms"], results[f"{ref_key}/norms"]
    assert_same_arithmetic(f"{src} -> {dst} ({flavour}), steps 6-10", results[ref_key],
                           results[key], ref["norms"], got["norms"], clip=ref["clip"])
