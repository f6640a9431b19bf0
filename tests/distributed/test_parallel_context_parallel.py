"""Context parallelism (Ulysses, parallel.context_parallel_size) against one rank: fp32, dropout
off, clipping on, 5 steps and an evaluation after them, for the GPT-2 and the Llama flavour
(Llama's two key/value heads are fewer than CP4's degree and than CP2 x TP2's per
tensor-parallel rank, so the replication of key/value heads is exercised).

Three jobs, in the launches shared with the other equivalence modules (one per world size: start-up
dominates; tests/support/launch_batches.py; the worker's LLAMA_ONLY layouts in the Llama flavour
alone): 2 ranks (CP2, recomputation, bf16; the CP2
checkpoint), 1 rank (the reference; CP2's checkpoint continued on one rank), 4 ranks (CP4, CP2 x
TP2, CP2 x PP2, CP2 x DP2 with ZeRO-1, 2 and 3, CP2 x TP2 with Megatron SP; TP2 x PP2's checkpoint
continued under CP2 x TP2). Each names its layout and flavour, so a failure localizes: the exchange
(CP only), its composition with TP's heads, PP's activations, ZeRO's group (dp x cp) or SP's
sequence shards; `grads` compares every parameter's gradient directly."""
import os

import pytest

from tests.support.context_parallel_worker import LLAMA_ONLY
from tests.support.launch_batches import TIMEOUT_S
from tests.support.paths import ROOT

WORKER = os.path.join(ROOT, "tests", "support", "context_parallel_worker.py")
TWO_RANK = ["cp2", "cp2_recompute_full", "cp2_masked", "cp2_ring_masked", "cp2_docs",
            "cp2_docs_pos", "cp2_qk_norm", "cp2_ring_qk_norm"]
FOUR_RANK = ["cp4", "cp2tp2", "cp2pp2", "cp2dp2_zero1", "cp2dp2_zero2", "cp2dp2_zero3",
             "cp2tp2_sp", "cp2tp2_recompute_selective"]
# the one-rank run each is held to, where it is not "single" (data.eod_mask_loss's)
REFERENCE = {"cp2_masked": "single_masked", "cp2_ring_masked": "single_masked",
             "cp2_docs": "single_docs", "cp2_docs_pos": "single_docs_pos",
             "cp2_qk_norm": "single_qk_norm",
             "cp2_ring_qk_norm": "single_qk_norm"}
# A checkpoint continues under another degree: (source layout, continuing layout).
PAIRS = [("cp2", "single"), ("tp2pp2", "cp2tp2")]
FLAVOURS = ["gpt2", "llama"]
# the layouts trained in the Llama flavour alone: context_parallel_worker.LLAMA_ONLY
CASES = [(name, flavour) for name in TWO_RANK + FOUR_RANK for flavour in FLAVOURS
         if flavour == "llama" or name not in LLAMA_ONLY]
TOLERANCE = 1e-5
BF16_TOLERANCE = 2e-3  # bf16 activations against fp32, as tests/distributed/test_training_*

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TIMEOUT_S)]


def launches(tmp):
    """2 ranks (the CP2 checkpoint), then 1 (which continues it), then 4: shared with the other
    equivalence modules, one launch per world size (tests/support/launch_batches.py)."""
    return [(2, WORKER, ["--workdir", tmp, "--grads", "--layouts",
                         ",".join(TWO_RANK + ["cp2_bf16"]), "--sources", "cp2"]),
            (1, WORKER, ["--workdir", tmp, "--layouts",
                         "single,single_masked,single_docs,single_docs_pos,single_qk_norm",
                         "--continue", "cp2>single"]),
            (4, WORKER, ["--workdir", tmp, "--grads", "--layouts", ",".join(FOUR_RANK),
                         "--sources", "tp2pp2", "--continue", "tp2pp2>cp2tp2"])]


@pytest.fixture(scope="module")
def results(shared_launches):
    return shared_launches.results(__name__)


def _close(got, ref):
    return len(got) == len(ref) and all(abs(a - b) <= TOLERANCE * abs(b) for a, b in zip(got, ref))


def _worst(got, ref):
    assert len(got) == len(ref) == 5
    return max(abs(a - b) / abs(b) for a, b in zip(got, ref))


@pytest.mark.parametrize("layout, flavour", CASES, ids=[f"{n}-{f}" for n, f in CASES])
def test_layout_matches_one_rank(results, layout, flavour):
    ref = results[f"{REFERENCE.get(layout, 'single')}/{flavour}"]
    got = results[f"{layout}/{flavour}"]
    worst = _worst(got["losses"], ref["losses"])
    print(f"{layout}/{flavour}: worst relative loss difference {worst:.2e}")
    assert worst <= TOLERANCE, f"{layout}/{flavour}: {got['losses']} vs {ref['losses']}"
    assert got["valid"] and _close(got["valid"], ref["valid"]), (got["valid"], ref["valid"])
    norms = got["grad_norms"]
    if norms[0] is not None:  # DeepSpeed reports the norm under ZeRO (not its ZeRO-0 path)
        assert _worst(norms, ref["grad_norms"]) <= TOLERANCE, (norms, ref["grad_norms"])


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("cp", [2, 4])
def test_every_gradient_matches_one_rank(results, cp, flavour):
    worst = results[f"grads/cp{cp}/{flavour}"]
    assert worst <= TOLERANCE, f"CP{cp}/{flavour}: a parameter's gradient differs by {worst:.2e}"


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("src, dst", PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
def test_checkpoint_continues_under_another_degree(results, src, dst, flavour):
    continued = results[f"{src}>{dst}/{flavour}"]["losses"]
    in_place = results[f"{src}@10/{flavour}"]["losses"][5:]
    worst = _worst(continued, in_place)
    assert worst <= TOLERANCE, (f"{src} -> {dst} ({flavour}): steps 6-10 {continued} vs "
                                f"continuing in place {in_place}, worst relative {worst:.2e}")


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_bf16_tracks_fp32(results, flavour):
    ref, got = results[f"single/{flavour}"]["losses"], results[f"cp2_bf16/{flavour}"]["losses"]
    assert _worst(got, ref) <= BF16_TOLERANCE and got[-1] < got[0], got
