"""Interleaved 1F1B (parallel.pipeline_schedule=interleaved, virtual_pipeline_size=2) against
DeepSpeed's 1F1B on real ranks (gloo), each case trained twice in one launch on the same
micro-batches: fp32, dropout off, ZeRO-1, clipping on, 10 steps. The per-step losses must be
the same bit for bit: each chunk accumulates its micro-batches' gradients in the same order, the
tied embedding's two halves are summed as DeepSpeed sums them, and the update is DeepSpeed's own
_take_model_step with the groups of its pipeline grid. The gradient norm is a sum of squares
over ranks that hold other layers than under 1F1B, added in another grouping: equal, or an ulp
or two apart (relative 1e-7, NORM_BOUND), by the values and the CPU (GPT-2 at PP2 was equal on
one development machine and an ulp apart at step 4 on an AVX-512 one, and its loss 2e-7 apart
from step 9). So the losses are bit for bit up to the first step clipped with different norms,
and within tests/support/exactness.DRIFT_BOUND after it.

bf16 (DeepSpeed's ZeRO-1 optimizer over bf16 weights, as 1F1B gets it): the same gradient
arithmetic, so the losses are measured identical too; they are held to BF16_BOUND, because at PP4
the norm's last-ulp difference reaches the clipping coefficient and a bf16 weight may round
the other way.

ZB-V (parallel.pipeline_schedule=zbv: two chunks per rank in a V, each backward split into B and
a deferred W, engine/v_order.py) on the same executor: the same arithmetic again, each chunk's
B and W in micro-batch order, the tied embedding's halves both on rank 0 and summed there; the
losses bit for bit, at PP2, PP4 and TP2 x PP2, and in bf16 (held to BF16_BOUND) at PP2.

Uneven model chunks (parallel.pipeline_first/last_stage_layers with v = 2: the first and the last
chunk 1 layer of 6, chunks [1, 2, 2, 1]) under both schedules, against 1F1B on even stages: the
losses bit for bit, and rank 0 holding the layers the split puts there.

The embedding and the head counted as a layer each (parallel.pipeline_embedding_as_layer,
pipeline_loss_as_layer; Llama 3 405B's split): 2 layers in chunks [0, 1, 1, 0], so the end
chunks hold the embedding alone and the head alone (under ZB-V rank 0 holds both and no
transformer layer), against 1F1B on even stages: the losses bit for bit.

Micro-batches in groups (parallel.pipeline_microbatch_group, Megatron Core's
--microbatch-group-size-per-virtual-pipeline-stage): 5 micro-batches on PP2 in groups of 3 and
2, 6 on PP4 in one group of 6, counts the default grouping (by the stages) refuses; each chunk
still takes its micro-batches in increasing order, so the losses are bit for bit 1F1B's.

Two jobs, in the launches shared with the other distributed modules (one per world size:
tests/support/launch_batches.py): 2 ranks (PP2 x v2 fp32 and bf16, ZB-V PP2, uneven chunks,
grouped; GPT-2 with tied embeddings and Llama) and 4 ranks (PP4 x v2 on 8 layers, fp32 and bf16;
TP2 x PP2 x v2; ZB-V PP4 and TP2 x PP2; grouped)."""
import os

import pytest

from tests.support.exactness import assert_same_arithmetic
from tests.support.launch_batches import TIMEOUT_S
from tests.support.paths import ROOT

WORKER = os.path.join(ROOT, "tests", "support", "interleaved_worker.py")
TWO = ["pp2v2-gpt2", "pp2v2-llama"]
FOUR = ["pp4v2-gpt2", "pp4v2-llama", "tp2pp2v2-gpt2"]
ZBV_TWO = ["pp2zbv-gpt2", "pp2zbv-llama"]
ZBV_FOUR = ["pp4zbv-gpt2", "pp4zbv-llama", "tp2pp2zbv-gpt2"]
BF16_TWO = ["pp2v2bf16-gpt2", "pp2v2bf16-llama", "pp2bf16zbv-llama"]
BF16_FOUR = ["pp4v2bf16-llama"]
# uneven model chunks, first and last 1 layer of 6, against 1F1B on even stages
UNEVEN_TWO = ["pp2v2u-llama", "pp2uzbv-gpt2"]
# the ends counted as a layer: 2 layers in chunks [0, 1, 1, 0]
COUNTED_TWO = ["pp2v2e-gpt2", "pp2ezbv-llama"]
# micro-batches in groups (parallel.pipeline_microbatch_group): 5 on PP2 in groups of 3, 6 on
# PP4 in one group of 6, neither a multiple of the stages
GROUPED = {"pp2v2g3-llama": 3, "pp4v2g6-gpt2": 6}
STEPS = 10
NORM_BOUND = 1e-6  # relative
BF16_BOUND = 1e-3  # relative, per step's loss

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TIMEOUT_S)]


def launches(tmp):
    """Each case under 1F1B and its chunked schedule, 2 ranks then 4."""
    def job(nproc, cases):
        return nproc, WORKER, ["--cases", ",".join(cases), "--workdir", tmp, "--steps", str(STEPS)]
    return [job(2, TWO + BF16_TWO + ZBV_TWO + UNEVEN_TWO + COUNTED_TWO + ["pp2v2g3-llama"]),
            job(4, FOUR + BF16_FOUR + ZBV_FOUR + ["pp4v2g6-gpt2"])]


@pytest.fixture(scope="module")
def results(shared_launches):
    return shared_launches.results(__name__)


def _chunked(results, case):
    """The case's run under its chunked schedule (interleaved, or zbv for the *zbv layouts)."""
    return results[case]["zbv" if case.split("-")[0].endswith("zbv") else "interleaved"]


@pytest.mark.parametrize("case", TWO + FOUR + ZBV_TWO + ZBV_FOUR + UNEVEN_TWO + COUNTED_TWO
                         + list(GROUPED))
def test_interleaved_is_bit_identical_to_1f1b(results, case):
    ref, got = results[case]["1f1b"], _chunked(results, case)
    assert len(got["losses"]) == STEPS
    assert_same_arithmetic(case, ref["losses"], got["losses"], ref["grad_norms"],
                           got["grad_norms"], clip=ref["clip"], norm_bound=NORM_BOUND)
    assert got["losses"][-1] < got["losses"][0], f"{case}: does not learn"


@pytest.mark.parametrize("case", list(GROUPED))
def test_grouped_micro_batches_ran_in_their_groups(results, case):
    """The executor ran the grouped order (the chunked run's order carries the group; 1F1B's
    DeepSpeed engine has none)."""
    assert _chunked(results, case)["group"] == GROUPED[case]
    assert results[case]["1f1b"]["group"] == 0


@pytest.mark.parametrize("case", BF16_TWO + BF16_FOUR)
def test_bf16_interleaved_tracks_1f1b(results, case):
    ref, got = results[case]["1f1b"], _chunked(results, case)
    assert got["dtype"] == ref["dtype"] == "torch.bfloat16", (got["dtype"], ref["dtype"])
    assert len(got["losses"]) == STEPS
    worst = max(abs(a - b) / b for a, b in zip(got["losses"], ref["losses"]))
    assert worst <= BF16_BOUND, f"{case}: {got['losses']} vs {ref['losses']} ({worst:.1e})"
    assert got["losses"][-1] < got["losses"][0], f"{case}: does not learn"


@pytest.mark.parametrize("case", ZBV_TWO + ZBV_FOUR)
def test_zbv_defers_the_weight_gradients(results, case):
    """Rank 0 holds the embedding, layer 0, the last layer and the head (and with them the
    tied embedding twice): W passes ran for its TP layers' weights."""
    got = results[case]["zbv"]
    assert got["deferred"] > 0
    layers = sorted({int(n.split(".")[1]) for n in got["names"] if n.startswith("layers.")})
    assert layers[0] == 0 and layers[-1] == (7 if case.startswith("pp4") else 3), layers


@pytest.mark.parametrize("case, layers", [("pp2v2u-llama", [0, 3, 4]), ("pp2uzbv-gpt2", [0, 5]),
                                          ("pp2v2e-gpt2", [1]), ("pp2ezbv-llama", [])])
def test_uneven_chunks_hold_the_set_layers(results, case, layers):
    """Chunks [1, 2, 2, 1] of 6 layers: rank 0 holds chunks 0 and 2 under the interleaved loop
    (layers 0, 3, 4), chunks 0 and 3 under ZB-V's V (layers 0 and 5, the embedding and the head
    beside them). The ends counted as a layer, chunks [0, 1, 1, 0] of 2: rank 0 holds the
    embedding alone and layer 1 under the loop, the embedding and the head alone under the V."""
    names = _chunked(results, case)["names"]
    assert sorted({int(n.split(".")[1]) for n in names if n.startswith("layers.")}) == layers
    assert "embedding.word_embeddings.weight" in names


@pytest.mark.parametrize("case", TWO + FOUR + ZBV_TWO + ZBV_FOUR + UNEVEN_TWO)
def test_parameters_keep_their_gpt_model_names(results, case):
    """Rank 0 holds chunks 0 and p under interleaving: other layers than 1F1B's first stage,
    under the names a GPTModel gives them (the layout-free checkpoint's)."""
    names = _chunked(results, case)["names"]
    assert "embedding.word_embeddings.weight" in names
    assert any(n.startswith("layers.0.") for n in names)
    assert all(n.split(".")[0] in ("embedding", "layers", "final_norm", "output") for n in names)
