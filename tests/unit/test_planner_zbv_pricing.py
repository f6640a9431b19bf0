"""ZB-V's step time as the planner prices it (planner/timing.py): the V ends on the first stage,
so that stage holds the output layer and loss beside the embedding, no tied-embedding all-reduce
runs between stages, and the last stage, where the V turns, hands its two chunks' activation and
gradient to each other without a send. Checked against the same terms taken by hand from the
1F1B pricing of the same layout (memory's side: test_planner_measured_peak.py)."""
import dataclasses

import pytest

from megatron.planner.layout import Job, Layout
from megatron.planner.models import preset_model
from megatron.planner.params import stage_params
from megatron.planner.profile import load_profile
from megatron.planner.timing import (COMM, GEMM, _Ctx, reduction_features, stage_features,
                                     stage_keys, step_time)

JOB = Job(preset_model("gpt3-1.3b"), 64, "bf16")  # 24 layers, tied embeddings
PROF = load_profile("frontier")
ZBV = Layout(tp=1, pp=2, dp=2, micro_batch=1, grad_accum=32, zero=1, interleave=2,
             schedule="zbv")
V1F1B = dataclasses.replace(ZBV, schedule="1f1b")  # interleaved 1F1B: the same chunks, in order


def test_the_head_is_on_the_first_stage_and_the_v_turns_on_the_last():
    assert ZBV.head_stage == 0 and V1F1B.head_stage == 1
    assert stage_keys(JOB.model, ZBV) == [(12, True, True, False, 0), (12, False, False, True, 0)]
    assert stage_keys(JOB.model, V1F1B) == [(12, True, False, False, 0),
                                            (12, False, True, False, 0)]


def test_stage_features_move_the_head_and_drop_the_turns_sends():
    x = _Ctx(JOB, ZBV, PROF)
    head = stage_features(x, 12, False, True) - stage_features(x, 12, False, False)
    # the head's forward and backward GEMMs: 3 x [tokens, vocab] x [hidden]
    assert head[GEMM] > 0
    zbv_first = stage_features(x, 12, True, True)
    plain_first = stage_features(x, 12, True, False)
    assert zbv_first[GEMM] - plain_first[GEMM] == pytest.approx(head[GEMM], rel=1e-12)
    # a middle-like stage sends 4 V = 8 hops; the turn keeps 4 of them on the stage
    middle, turn = stage_features(x, 12, False, False), stage_features(x, 12, False, False, True)
    assert turn[COMM] == pytest.approx(middle[COMM] / 2, rel=1e-12)


def test_no_tied_embedding_all_reduce_when_one_stage_holds_both_copies():
    x = _Ctx(JOB, ZBV, PROF)
    sp = stage_params(JOB.model, 1, 2, 0, head_stage=0)
    assert sp.output_layer > 0 and sp.word_embedding > 0  # both copies on stage 0
    with_sync = reduction_features(x, sp, True)
    without = reduction_features(x, sp, False)
    assert with_sync[COMM] > without[COMM]
    # step_time passes False for every stage under ZB-V: its reduction is the one without it
    est, plain = step_time(JOB, ZBV, PROF), step_time(JOB, V1F1B, PROF)
    assert est.step_s > 0 and plain.step_s > 0
    assert est.reduce_s == pytest.approx(
        max(without.dot(_theta()), reduction_features(
            x, stage_params(JOB.model, 1, 2, 1, head_stage=0), False).dot(_theta())), rel=1e-9)


def _theta():
    from megatron.planner.timing import theta
    return theta(PROF.constants)
