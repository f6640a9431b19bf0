"""Ring, all-gather and hybrid context parallelism (parallel.context_parallel_algo) against one
rank: fp32, dropout off, clipping on, 5 steps and an evaluation, GPT-2 (learned positions) and
Llama (rotary, two key/value heads: grouped-query attention) flavours, through the trainer in
process (tests/support/ring_attention_worker.py, which extends context_parallel_worker.py).

Six jobs, in the launches shared with the other equivalence modules (one per world size: start-up
dominates; tests/support/launch_batches.py; the worker's RING_LLAMA_ONLY layouts in the Llama
flavour alone): 2 ranks (ring CP2, all-gather CP2, and packed documents under them:
data.reset_attention_mask and reset_position_ids, held to one rank's run with the same settings; a
sliding window on every other layer, model.attention, under ring, all-gather and Ulysses CP2; ring
CP2's checkpoint continued under Ulysses CP2), 1 rank (the reference, also 15 steps in place; ring
CP2's checkpoint continued on one rank), 4 ranks (ring CP4, all-gather CP4, hybrid Ulysses 2 x ring
2, ring CP2 x TP2 without and with sequence parallelism, and with it under full recompute, ring CP2
x DP2 with ZeRO-1 and ZeRO-3, ring CP2 x PP2 under 1F1B and ZB-H1, Ulysses CP2 x PP2 under ZB-H1;
ring CP2 x PP2 under interleaved 1F1B (v2) and ZB-V and Ulysses CP2 x PP2 interleaved, on the
project's chunk executor; ring CP4 saved at step 5 of 15; packed documents under ring CP4, hybrid,
ring CP2 x PP2 and ring CP2 x TP2 with SP; a sliding window on every other layer with packed
documents under ring CP4 and ring CP2 x PP2 under ZB-V), 8 ranks (ring CP8: 8 ranks past
tiny.yaml's 4 query heads, Ulysses' cap), then a second round: 2 ranks (ring CP4's checkpoint
continued under Ulysses CP2 to step 10, saved) and 1 rank (that one continued to step 15), held to
one rank's 15 steps in place.
Each names its layout and flavour, so a failure localizes: the ring (ring_*), the gather
(allgather_*), their composition with Ulysses' exchange (hybrid), TP's heads, ZeRO's group;
`grads` compares every parameter's gradient directly, the continuations that a checkpoint
is layout-free and the data position and random streams resume as before."""
import os

import pytest

from tests.support.launch_batches import TIMEOUT_S
from tests.support.paths import ROOT
from tests.support.ring_attention_worker import RING_LLAMA_ONLY as LLAMA_ONLY

WORKER = os.path.join(ROOT, "tests", "support", "ring_attention_worker.py")
TWO_RANK = ["ring_cp2", "allgather_cp2", "ring_cp2_docs", "ring_cp2_docs_pos",
            "allgather_cp2_docs_pos", "ring_cp2_pos", "ring_cp2_window", "allgather_cp2_window",
            "ulysses_cp2_window"]
FOUR_RANK = ["ring_cp4", "allgather_cp4", "hybrid_u2r2", "ring_cp2tp2", "ring_cp2tp2_sp",
             "ring_cp2tp2_sp_recompute", "ring_cp2dp2_zero1",
             "ring_cp2dp2_zero3", "ring_cp2pp2", "ring_cp2pp2_zbh1", "ulysses_cp2pp2_zbh1",
             "ring_cp2pp2v2", "ring_cp2pp2_zbv", "ulysses_cp2pp2v2", "ring_cp4_docs_pos",
             "hybrid_u2r2_docs_pos", "ring_cp2pp2_docs_pos", "ring_cp2tp2_sp_docs_pos",
             "ring_cp4_window_docs", "ring_cp2pp2_zbv_window_docs"]
# the one-rank run each is held to, where it is not "single": the documents' (data.reset_*)
REFERENCE = {"ring_cp2_docs": "single_docs", "ring_cp2_pos": "single_pos",
             "ring_cp4_window_docs": "single_window_docs",
             "ring_cp2pp2_zbv_window_docs": "single_window_docs",
             **{name: "single_window" for name in TWO_RANK if name.endswith("_window")},
             **{name: "single_docs_pos" for name in TWO_RANK + FOUR_RANK
                if name.endswith("_docs_pos")}}
EIGHT_RANK = ["ring_cp8"]
GRADS = ["ring_cp2", "allgather_cp2", "ring_cp4", "hybrid_cp4", "ring_cp8"]
PAIRS = [("ring_cp2", "cp2"), ("ring_cp2", "single")]  # saved under ring, continued under ...
# saved under ring CP4 at step 5, continued under Ulysses CP2 to step 10, then on one rank to 15
CHAIN, CHAIN_STEPS = ["ring_cp4", "cp2", "single"], 15
FLAVOURS = ["gpt2", "llama"]
# the layouts trained in the Llama flavour alone: ring_attention_worker.RING_LLAMA_ONLY
CASES = [(name, flavour) for name in TWO_RANK + FOUR_RANK + EIGHT_RANK for flavour in FLAVOURS
         if flavour == "llama" or name not in LLAMA_ONLY]
TOLERANCE = 1e-5

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TIMEOUT_S)]


def launches(tmp):
    """2 ranks (ring CP2's checkpoint), 1 (continues it), 4, 8: shared with the other
    equivalence modules, one launch per world size (tests/support/launch_batches.py)."""
    return [(2, WORKER, ["--workdir", tmp, "--ring-grads", "--layouts", ",".join(TWO_RANK),
                         "--sources", "ring_cp2", "--continue", "ring_cp2>cp2"]),
            (1, WORKER, ["--workdir", tmp, "--layouts",
                         "single,single_docs,single_docs_pos,single_pos,single_window,"
                         "single_window_docs", "--continue",
                         "ring_cp2>single", "--in-place", f"single@{CHAIN_STEPS}"]),
            (4, WORKER, ["--workdir", tmp, "--ring-grads", "--layouts", ",".join(FOUR_RANK),
                         "--saved", f"{CHAIN[0]}@{CHAIN_STEPS}"]),
            # the gradient check of ring CP8 in Llama alone too
            (8, WORKER, ["--workdir", tmp, "--ring-grads", "--flavours", "llama", "--layouts",
                         ",".join(EIGHT_RANK)]),
            # the second round: ring CP4's checkpoint under Ulysses CP2, then on one rank
            (2, WORKER, ["--workdir", tmp, "--continue", f"{'>'.join(CHAIN[:2])}@{CHAIN_STEPS}"]),
            (1, WORKER, ["--workdir", tmp, "--continue", f"{'>'.join(CHAIN)}@{CHAIN_STEPS}"])]


@pytest.fixture(scope="module")
def results(shared_launches):
    return shared_launches.results(__name__)


def _worst(got, ref):
    assert len(got) == len(ref) and len(got) >= 1
    return max(abs(a - b) / abs(b) for a, b in zip(got, ref))


@pytest.mark.parametrize("layout, flavour", CASES, ids=[f"{n}-{f}" for n, f in CASES])
def test_layout_matches_one_rank(results, layout, flavour):
    ref = results[f"{REFERENCE.get(layout, 'single')}/{flavour}"]
    got = results[f"{layout}/{flavour}"]
    worst = _worst(got["losses"], ref["losses"])
    print(f"{layout}/{flavour}: worst relative loss difference {worst:.2e}")
    assert len(got["losses"]) == 5 and worst <= TOLERANCE, \
        f"{layout}/{flavour}: {got['losses']} vs {ref['losses']}"
    assert got["valid"] and _worst(got["valid"], ref["valid"]) <= TOLERANCE, \
        (got["valid"], ref["valid"])
    norms = got["grad_norms"]
    if norms[0] is not None:  # DeepSpeed reports the norm under ZeRO (not its ZeRO-0 path)
        assert _worst(norms, ref["grad_norms"]) <= TOLERANCE, (norms, ref["grad_norms"])


GRAD_CASES = [(algo, flavour) for algo in GRADS for flavour in FLAVOURS
              if flavour == "llama" or algo not in LLAMA_ONLY]


@pytest.mark.parametrize("algo, flavour", GRAD_CASES, ids=[f"{a}-{f}" for a, f in GRAD_CASES])
def test_every_gradient_matches_one_rank(results, algo, flavour):
    worst = results[f"grads/{algo}/{flavour}"]
    print(f"grads/{algo}/{flavour}: worst relative gradient difference {worst:.2e}")
    assert worst <= TOLERANCE, f"{algo}/{flavour}: a parameter's gradient differs by {worst:.2e}"


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("src, dst", PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
def test_ring_checkpoint_continues_under_another_algorithm(results, src, dst, flavour):
    continued = results[f"{src}>{dst}/{flavour}"]["losses"]
    in_place = results[f"{src}@10/{flavour}"]["losses"][5:]
    worst = _worst(continued, in_place)
    assert len(continued) == 5 and worst <= TOLERANCE, \
        f"{src} -> {dst} ({flavour}): steps 6-10 {continued} vs in place {in_place}"


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_ring_cp4_checkpoint_continues_under_ulysses_cp2_then_on_one_rank(results, flavour):
    hops = [results[f"{'>'.join(CHAIN[:n])}@{CHAIN_STEPS}/{flavour}"]["losses"]
            for n in range(2, len(CHAIN) + 1)]
    first = results[f"{CHAIN[0]}@{CHAIN_STEPS}:saved/{flavour}"]["losses"]
    one_rank = results[f"single@{CHAIN_STEPS}/{flavour}"]["losses"]
    assert [len(h) for h in [first, *hops]] == [5, 5, 5], (first, hops)
    chained = first + hops[0] + hops[1]
    worst = _worst(chained, one_rank)
    print(f"ring CP4 -> Ulysses CP2 -> one rank ({flavour}): worst relative loss difference "
          f"{worst:.2e} over {CHAIN_STEPS} steps")
    assert worst <= TOLERANCE, \
        f"{' -> '.join(CHAIN)} ({flavour}): {chained} vs one rank in place {one_rank}"
