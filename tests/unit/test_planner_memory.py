"""The activation formulas and the published memory figures. A failure names which term of the
memory model (activations, recompute, 1F1B in-flight count, model states) moved."""
import dataclasses

import pytest

from megatron.planner import activations as act
from megatron.planner.layout import Job, Layout
from megatron.planner.memory import GIB, in_flight, memory_per_stage, peak_memory
from megatron.planner.models import preset_model
from megatron.planner.profile import Constants, load_profile

M175 = preset_model("175b")


def lay(**kw):
    base = dict(tp=1, pp=1, dp=1, micro_batch=1, grad_accum=1, zero=1, recompute="none",
                flash=False, sequence_parallel=False)
    base.update(kw)
    return Layout(**base)


@pytest.mark.parametrize("t,sp,flash", [(1, False, False), (4, False, False), (8, False, False),
                                        (4, True, False), (8, True, True), (2, False, True)])
def test_layer_activations_reduce_to_korthikanti(t, sp, flash):
    # 16-bit activations, dropout on, GeLU 4h, MHA: the paper's closed forms exactly (the flash
    # path adds only its fp32 log-sum-exp rows).
    m, s, b = M175, 2048, 2
    got = act.layer_stored_bytes(m, lay(tp=t, micro_batch=b, flash=flash, sequence_parallel=sp),
                                 "bf16")
    want = act.korthikanti_bytes(s, b, m.hidden_size, m.num_attention_heads, t, sp, flash)
    lse = 4 * m.num_attention_heads * s * b / t if flash else 0
    assert got == pytest.approx(want + lse, rel=1e-12)


def test_selective_recompute_drops_the_score_terms_and_full_keeps_the_input():
    m = M175
    none = act.layer_stored_bytes(m, lay(tp=8), "bf16")
    selective = act.layer_stored_bytes(m, lay(tp=8, recompute="selective"), "bf16")
    full = act.layer_stored_bytes(m, lay(tp=8, recompute="full"), "bf16")
    assert selective == pytest.approx(act.korthikanti_bytes(2048, 1, 12288, 96, 8, flash=True))
    assert full == 2 * 2048 * 12288 < selective < none


def test_fp32_doubles_activations_but_not_masks():
    m = preset_model("gpt3-125m")
    half = act.layer_stored_bytes(m, lay(), "bf16")
    full = act.layer_stored_bytes(m, lay(), "fp32")
    assert half < full < 2 * half


def test_first_stage_holds_p_micro_batches_under_1f1b():
    layout = lay(pp=16, grad_accum=640)
    assert [in_flight(layout, s) for s in (0, 1, 15)] == [16, 15, 1]
    assert in_flight(lay(pp=16, grad_accum=4), 0) == 4


def paper_175b_recipe():
    return Job(M175, 1280, "bf16"), Layout(tp=4, pp=16, dp=2, micro_batch=1, grad_accum=640,
                                           zero=1, recompute="full", flash=True)


def test_175b_recipe_memory_is_inside_the_logged_band():
    # Logged on Frontier (TP4 PP16 DP2, mb 1, gb 1280, ZeRO-1, full recompute, bf16):
    # 23-25 GB allocated, 33.9 GB peak per GCD.
    job, layout = paper_175b_recipe()
    peak = peak_memory(job, layout, load_profile("frontier").constants)
    assert 23.0 <= peak.peak_gb <= 34.0
    # weights + optimizer states alone: what stays allocated between steps
    assert 20.0 <= (peak.weights + peak.optimizer) / GIB <= 25.0
    assert peak.reserved_gb < 64


def test_175b_without_recompute_on_few_gpus_does_not_fit():
    job = Job(M175, 1280, "bf16")
    layout = Layout(tp=8, pp=8, dp=2, micro_batch=4, grad_accum=160, zero=1, recompute="none",
                    flash=False)
    assert peak_memory(job, layout, Constants()).reserved_gb > 64


def test_zero_stages_shrink_model_states():
    job = Job(preset_model("gpt3-1.3b"), 64, "bf16")
    states = [peak_memory(job, lay(dp=8, grad_accum=8, zero=z), Constants()).states_gb
              for z in range(4)]
    assert states[0] > states[1] > states[2] > states[3]


def test_constants_scale_activations_and_add_fixed_memory():
    job, layout = paper_175b_recipe()
    base = peak_memory(job, layout, Constants())
    more = peak_memory(job, layout, Constants(fixed_gb=1.25))
    assert more.peak_bytes - base.peak_bytes == pytest.approx(GIB)
    scaled = memory_per_stage(job, layout, Constants(act_scale=2.0))[0]
    assert scaled.activations == pytest.approx(2 * memory_per_stage(job, layout, Constants())[0].activations)


def test_sequence_parallel_and_flash_save_memory():
    job = Job(M175, 1280, "bf16")
    plain = lay(tp=8, pp=16, dp=1, micro_batch=2, grad_accum=640)
    sp = dataclasses.replace(plain, sequence_parallel=True)
    flash = dataclasses.replace(plain, flash=True)
    c = Constants()
    assert peak_memory(job, sp, c).peak_bytes < peak_memory(job, plain, c).peak_bytes
    assert peak_memory(job, flash, c).peak_bytes < peak_memory(job, plain, c).peak_bytes
