"""The activation formulas and the published memory figures. A failure names which term of the
memory model (activations, recompute, 1F1B in-flight count, model states) moved."""
import dataclasses
from unittest import mock

import pytest

from megatron.planner import activations as act
from megatron.planner.layout import Job, Layout
from megatron.config.errors import InputError
from megatron.config.schedules.one_f_one_b import in_flight
from megatron.planner.memory import (GIB, fsdp_state_bytes, megatron_state_bytes,
                                     memory_per_stage, peak_memory)
from megatron.planner.params import stage_params
from megatron.planner.models import preset_model
from megatron.planner.overlap import OVERLAP
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
    assert [in_flight(layout.pipe, s) for s in (0, 1, 15)] == [16, 15, 1]
    assert in_flight(lay(pp=16, grad_accum=4).pipe, 0) == 4


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


# Megatron-LM's docs/source/distrib_optimizer.md: bytes a parameter, d = data-parallel size
MEGATRON_TABLE = {("fp16", 0): lambda d: 20, ("bf16", 0): lambda d: 18, ("fp32", 0): lambda d: 16,
                  ("fp16", 1): lambda d: 4 + 16 / d, ("bf16", 1): lambda d: 6 + 12 / d,
                  ("fp32", 1): lambda d: 8 + 8 / d}


@pytest.mark.parametrize("precision,zero", sorted(MEGATRON_TABLE))
@pytest.mark.parametrize("d", [1, 8, 48])
def test_megatron_engines_hold_the_states_megatron_documents(precision, zero, d):
    """Under framework megatron-lm or megatron-core the states at the optimizer step are
    Megatron-LM's table, not DeepSpeed's (whose ZeRO-1 bf16 is 4 + 16/d with its fp32 step
    copy)."""
    n = 10 ** 9
    s = megatron_state_bytes(n, precision, zero, d)
    total = s.weights + s.grads + s.optimizer + s.step_transient + s.bucket
    assert total / n == pytest.approx(MEGATRON_TABLE[precision, zero](d))


def test_megatron_keeps_its_grad_buffer_through_the_step_and_deepspeed_frees_it():
    """ZeRO-1 at the step: DeepSpeed frees the gradients outside the rank's partition; the
    distributed optimizer keeps the whole fp32 buffer (it gathers the weights into it)."""
    job = Job(preset_model("gpt3-1.3b"), 64, "bf16")
    layout = lay(dp=8, grad_accum=8, zero=1)
    core = peak_memory(job, layout, Constants(), framework="megatron-core")
    n = core.params
    assert core.grads == pytest.approx(4 * n) and core.optimizer == pytest.approx(12 * n / 8)
    ds = peak_memory(job, layout, Constants())
    assert ds.grads == pytest.approx(2 * n) and core.peak_bytes > ds.peak_bytes


def test_nanotron_holds_megatrons_states_and_the_bf16_gradients_of_a_backward():
    """nanotron (overlap.py): Megatron's bf16 states (the fp32 gradient buffer whole, master
    and moments sharded at ZeRO-1) and the bf16 gradients a backward leaves on the
    parameters before they are added to the buffer: 2 bytes a parameter more at the
    backward's peak, so a stage's peak is Megatron Core's plus 2 n."""
    job = Job(preset_model("gpt3-1.3b"), 64, "bf16")
    for zero in (0, 1):
        layout = lay(dp=8, grad_accum=8, zero=zero)
        nano = peak_memory(job, layout, Constants(), framework="nanotron")
        core = peak_memory(job, layout, Constants(), framework="megatron-core")
        n = nano.params
        assert nano.grads == pytest.approx(4 * n) and nano.bucket == pytest.approx(2 * n)
        assert nano.optimizer == pytest.approx(12 * n / (8 if zero else 1))
        assert nano.peak_bytes - core.peak_bytes == pytest.approx(2 * n)


def test_fsdp_shards_fp32_states_and_gathers_two_blocks_and_the_root():
    """FSDP FULL_SHARD (ZeRO-3): 16/d bytes a parameter of fp32 weights, gradients and moments,
    plus the bf16 weights of two blocks and of the root unit (embeddings, final norm);
    SHARD_GRAD_OP (ZeRO-2) keeps the whole bf16 model gathered."""
    job = Job(preset_model("gpt3-1.3b"), 64, "bf16")
    sp = stage_params(job.model, 1, 1, 0)
    full = fsdp_state_bytes(sp, "bf16", 3, 8)
    root = sp.total - sp.transformer
    assert full.weights == pytest.approx(4 * sp.total / 8 + 2 * (root + 2 * sp.max_layer))
    assert (full.grads, full.optimizer) == pytest.approx((4 * sp.total / 8, 8 * sp.total / 8))
    assert full.step_transient == 0 and full.bucket == 0
    grad_op = fsdp_state_bytes(sp, "bf16", 2, 8)
    assert grad_op.weights == pytest.approx(4 * sp.total / 8 + 2 * sp.total)


def test_mosaics_30b_on_eight_a100s_fits_under_fsdp_as_it_trained():
    """llm-foundry trained MPT-30B on 8 A100 80 GB at micro-batch 3 (published.yaml
    mpt-30b-a8); priced as DeepSpeed's ZeRO-3 (its fp32 step copies) it would not fit."""
    from megatron.planner import validation as v
    case = v.load_published().by_id()["mpt-30b-a8"]
    cap = case.profile.spec.gpu_memory_gb * GIB
    assert peak_memory(case.job, case.layout, case.profile.constants,
                       framework="fsdp").reserved_bytes < cap
    assert peak_memory(case.job, case.layout, case.profile.constants).reserved_bytes > cap


@pytest.mark.parametrize("framework,layout,needle", [
    ("megatron-lm", lay(dp=8, grad_accum=8, zero=3), "Megatron-LM has no ZeRO-2 or 3"),
    ("megatron-core", lay(dp=8, grad_accum=8, zero=2), "pick --zero 0 or 1"),
    ("fsdp", lay(dp=8, grad_accum=8, zero=1), "pick --zero 2 or 3"),
    ("fsdp", lay(pp=2, dp=4, grad_accum=8, zero=1), "pick --zero 2 or 3"),
    ("aa-scaling", lay(dp=8, grad_accum=8, zero=2), "Aleph Alpha's Scaling shards the optimizer"),
    ("nanotron", lay(dp=8, grad_accum=8, zero=2), "nanotron shards the optimizer"),
])
def test_a_layout_the_engine_cannot_run_is_refused_by_name(framework, layout, needle):
    job = Job(preset_model("gpt3-1.3b"), 64, "bf16")
    with pytest.raises(InputError, match=needle):
        peak_memory(job, layout, Constants(), framework=framework)


def test_memory_prints_nothing_before_an_engine_refusal(capsys):
    """megatron-plan memory --zero 2 under aa-scaling: the one message alone (exit 2), not the
    model, cluster and layout lines and then the error."""
    from megatron.cli.plan import main
    assert main(["memory", "--model", "gpt3-13b", "--cluster", "a100", "--nodes", "2",
                 "--global-batch", "64", "--framework", "aa-scaling", "--tp", "2", "--pp", "2",
                 "--zero", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--zero 2 under framework aa-scaling" in err


def test_megatron_and_fsdp_free_a_stage_output_once_sent_and_deepspeed_keeps_it():
    """Megatron-LM's training sets deallocate_pipeline_outputs (the sent output's data freed
    until its backward) and Llama 3's stack "proactively deallocate[s]" stage outputs; DeepSpeed's
    pipeline engine (and Aleph Alpha's Scaling, priced so) keeps each output for its backward.
    By hand on stage 0 of PP 4 under 1F1B:
    4 micro-batches in flight, each one s b h / t output of 2 bytes (SP splits it over TP);
    Scaling keeps a fifth, a spent micro-batch's, in its buffer slot
    (Overlap.keeps_spent_outputs)."""
    job = Job(preset_model("gpt3-13b"), 64, "bf16")
    layout = lay(tp=2, pp=4, dp=1, grad_accum=64, zero=1, recompute="full",
                 sequence_parallel=True)
    c = Constants()
    kept = {fw: memory_per_stage(job, layout, c, framework=fw)[0].activations
            for fw in ("deepspeed", "megatron-deepspeed", "megatron-lm-2021", "megatron-lm",
                       "megatron-core", "aa-scaling")}
    m = job.model
    output = m.seq_length * m.hidden_size * 2 / 2
    assert in_flight(layout.pipe, 0) == 4
    for fw in ("deepspeed", "megatron-deepspeed", "megatron-lm-2021"):
        assert kept[fw] - kept["megatron-core"] == pytest.approx(4 * output * c.act_scale), fw
    assert kept["aa-scaling"] - kept["megatron-core"] == pytest.approx(5 * output * c.act_scale)
    assert kept["megatron-lm"] == kept["megatron-core"]
    fsdp = memory_per_stage(job, dataclasses.replace(layout, zero=2), c, framework="fsdp")
    assert fsdp[0].activations == kept["megatron-core"]


def test_aa_scaling_keeps_gathered_inputs_under_sp_and_the_whole_vocabulary_logits():
    """Aleph Alpha's Scaling (overlap.py): under SP its norm all-gathers its output and QKV and
    fc1 keep that whole input for their weight gradients (no shard kept, no regather), and its
    output layer all-gathers the logits for an fp32 loss over the whole vocabulary on every TP
    rank. By hand against megatron-deepspeed, whose model states are the same DeepSpeed ZeRO-1
    ones: stage 0 of PP 2 (1F1B: 2 micro-batches in flight) keeps 2 s b h x 2 bytes x
    (1 - 1/t) more a layer and micro-batch, and a spent micro-batch's output in its buffer slot
    (s b h / t x 2 bytes under SP: test_aa_scaling_keeps_a_spent_micro_batch_in_its_slot); the
    last stage's eager fp32 loss peaks in its backward at s b V (2 + 4 + 4 + 4) bytes, the
    gathered logits, the saved log-softmax and two fp32 gradients, where Megatron's
    vocab-parallel loss holds s b V / t (2 + 8)."""
    from megatron.planner.params import padded_vocab
    job = Job(preset_model("gpt3-13b"), 64, "bf16")
    m, c = job.model, Constants()
    layout = lay(tp=4, pp=2, dp=1, grad_accum=64, zero=1, recompute="none", flash=True,
                 sequence_parallel=True)
    aa = memory_per_stage(job, layout, c, framework="aa-scaling")
    ds = memory_per_stage(job, layout, c, framework="megatron-deepspeed")
    sbh = m.seq_length * m.hidden_size
    per_layer = 2 * sbh * 2 * (1 - 1 / 4)
    layers = m.num_layers // 2
    assert in_flight(layout.pipe, 0) == 2
    spent = sbh * 2 / 4
    assert aa[0].activations - ds[0].activations == pytest.approx(
        (2 * layers * per_layer + spent) * c.act_scale)
    assert (aa[0].weights, aa[0].grads, aa[0].optimizer) == (
        ds[0].weights, ds[0].grads, ds[0].optimizer)
    vocab = padded_vocab(m.vocab_size, m.make_vocab_size_divisible_by, 4)
    sv = m.seq_length * vocab
    loss = sv * (2 + 4 + 4 + 4) - sv * (2 + 8) / 4
    assert aa[1].working - ds[1].working == pytest.approx(loss * c.act_scale)
    # without SP the layers keep what every engine keeps; the loss is still over the whole
    # vocabulary
    plain = dataclasses.replace(layout, sequence_parallel=False)
    aa0, ds0 = (memory_per_stage(job, plain, c, framework=fw) for fw in ("aa-scaling",
                                                                         "megatron-deepspeed"))
    assert aa0[0].activations - ds0[0].activations == pytest.approx(sbh * 2 * c.act_scale)
    assert aa0[1].working - ds0[1].working == pytest.approx(loss * c.act_scale)


def test_aa_scaling_keeps_a_spent_micro_batch_in_its_slot():
    """Aleph Alpha's Scaling writes each stage's output to a buffer slot and reads it back
    (Buffers.get), never emptying it: it is freed only when a later micro-batch reuses the
    slot (a stage's input is taken once its gradient is sent). Stage r has
    max(2, min(p - r + 1, m)) slots for at most min(p - r, m) micro-batches in flight, so
    where a step has more than p - r micro-batches one spent micro-batch's output stays beside
    those in flight. By hand on PP 4, no SP, TP 2 (the same layout with the trait off keeps
    nothing spent): stages 0-2 one output, s b h x 2 bytes; the last stage its
    whole-vocabulary logits, s b V x 2. With m = p micro-batches stage 0 keeps nothing spent
    (p - 0 = m) and the others do; with one micro-batch no stage does."""
    from megatron.planner.memory import _spent_slot_bytes
    from megatron.planner.params import padded_vocab
    job = Job(preset_model("gpt3-1.3b"), 64, "bf16")
    m = job.model
    sbh, vocab = m.seq_length * m.hidden_size, padded_vocab(m.vocab_size,
                                                            m.make_vocab_size_divisible_by, 2)
    layout = lay(tp=2, pp=4, dp=1, grad_accum=64, zero=1, recompute="none", flash=True)
    want = [sbh * 2, sbh * 2, sbh * 2, m.seq_length * vocab * 2]
    got = [_spent_slot_bytes(job, layout, r, vocab, True) for r in range(4)]
    assert got == pytest.approx(want)
    c = Constants()
    aa = memory_per_stage(job, layout, c, framework="aa-scaling")
    plain = dataclasses.replace(OVERLAP["aa-scaling"], keeps_spent_outputs=False)
    with mock.patch.dict(OVERLAP, {"aa-scaling": plain}):
        base = memory_per_stage(job, layout, c, framework="aa-scaling")
    assert [a.activations - b.activations for a, b in zip(aa, base)] == pytest.approx(
        [w * c.act_scale for w in want])
    four = dataclasses.replace(layout, grad_accum=4)
    assert [_spent_slot_bytes(job, four, r, vocab, True) for r in range(4)] == pytest.approx(
        [0.0] + want[1:])
    one = dataclasses.replace(layout, pp=1, grad_accum=1)
    assert _spent_slot_bytes(job, one, 0, vocab, True) == 0.0
    assert _spent_slot_bytes(job, dataclasses.replace(one, grad_accum=2), 0, vocab,
                             True) == pytest.approx(m.seq_length * vocab * 2)


def test_head_width_and_head_norms_in_the_stored_activations():
    """model.attention.kv_channels and qk_norm, by hand: 4 query heads and 2 key/value heads of
    24 (hidden 64), s 64 x b 2 = 128 tokens, GeLU f 256. Stored, over TP: Q (4 x 24) and K
    (2 x 24) for QK^T, V (2 x 24), the context (4 x 24), fc1's output and fc2's input (2 x 256);
    the head norms keep Q and K as projected too."""
    from megatron.config import load_config
    base = ["model.hidden_size=64", "model.num_attention_heads=4", "model.num_query_groups=2",
            "model.seq_length=64", "model.attention.kv_channels=24", "model.ffn_hidden_size=256"]
    m = load_config(None, base).model
    attention = 128 * (96 + 48) + 128 * 48 + 128 * 96
    assert act.layer_terms(m, 64, 2).partitioned == attention + 128 * 256 * 2
    normed = load_config(None, base + ["model.attention.qk_norm=true"]).model
    assert act.layer_terms(normed, 64, 2).partitioned == attention + 128 * (96 + 48) \
        + 128 * 256 * 2


def test_softcapping_keeps_the_capped_scores_and_logits_by_hand():
    """Gemma 2's caps: the math path keeps the capped scores for tanh's backward (one more
    s x s per head: 4 heads x 64 x 64 x b 2), and the loss the capped logits (s x b x V/t in
    the activation dtype); flash attention keeps no scores, so its cap costs nothing there."""
    from megatron.config import load_config
    base = ["model.hidden_size=64", "model.num_attention_heads=4", "model.seq_length=64"]
    plain = load_config(None, base).model
    capped = load_config(None, base + ["model.attention.logit_softcapping=50",
                                       "model.output.logit_softcapping=30"]).model
    assert act.layer_terms(capped, 64, 2).scores - act.layer_terms(plain, 64, 2).scores \
        == 4 * 64 * 64 * 2
    for tp in (1, 2):
        layout = lay(tp=tp, micro_batch=2)
        assert act.logits_bytes(capped, layout, 512, "bf16") \
            - act.logits_bytes(plain, layout, 512, "bf16") == 64 * 2 * 512 / tp * 2
        flash = dataclasses.replace(layout, flash=True)
        assert act.layer_stored_bytes(capped, flash, "bf16") == act.layer_stored_bytes(
            plain, flash, "bf16")
