"""The learning-rate schedule counted in samples (optimizer.lr_warmup_samples, lr_decay_samples,
lr_wsd_decay_samples; Megatron-LM's --lr-*-samples): with one batch size it gives the rates
counting steps gives; on a batch-size ramp it follows the samples, by hand; fp16's skipped steps
count no samples; a checkpoint records the count, and one from before it is read as full
batches; a resume that changes the unit or the run's length is named; the settings are refused
mixed or out of range, with the field and the fix; a run measured in samples
(training.train_samples) ends its decay there."""
import math

import pytest
import torch

from megatron.config import ConfigError, load_config, validate_for_world
from megatron.config.sections.training import TrainingConfig
from megatron.config.unused import unread_settings
from megatron.engine.optimizer import WarmupDecayLR, lr_at, schedule_change


def opt(**kw):
    return load_config(None, [f"optimizer.{k}={v}" for k, v in kw.items()]).optimizer


def run(train_iters, batch=8, ramp=None):
    return TrainingConfig(train_iters=train_iters, global_batch_size=batch, micro_batch_size=2,
                          rampup_batch_size=ramp)


def scheduler(cfg, t):
    return WarmupDecayLR(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), cfg, t)


def rates(cfg, t, steps=None, skipped=()):
    """Each step's rate as the engine drives the scheduler: the step's batch set first, and
    step() after every step not skipped."""
    sched, consumed, out = scheduler(cfg, t), 0, []
    for i in range(steps or t.train_iters):
        sched.set_batch(t.global_batch_at(consumed))
        out.append(sched.get_last_lr()[0])
        consumed += sched.batch
        if i not in skipped:
            sched.step()
    return out, sched


@pytest.mark.parametrize("style, extra", [("cosine", {}), ("linear", {}), ("constant", {}),
                                          ("inverse-square-root", {}),
                                          ("wsd", {"wsd_decay": 4})])
def test_one_batch_size_gives_the_rates_counting_steps_gives(style, extra):
    t, batch = run(12), 8
    wsd = extra.get("wsd_decay")
    steps = dict(lr=1.0, min_lr=0.1, lr_warmup_iters=3, lr_decay_iters=10,
                 lr_decay_style=style, **({"lr_wsd_decay_iters": wsd} if wsd else {}))
    samples = dict(lr=1.0, min_lr=0.1, lr_warmup_samples=3 * batch, lr_decay_samples=10 * batch,
                   lr_decay_style=style,
                   **({"lr_wsd_decay_samples": wsd * batch} if wsd else {}))
    by_steps, _ = rates(opt(**steps), t)
    by_samples, sched = rates(opt(**samples), t)
    assert by_samples == pytest.approx(by_steps, rel=1e-12)
    assert sched.samples == 12 * batch and sched.last_step == 12
    assert len(set(by_steps)) > (1 if style == "constant" else 5)  # the schedule moves


def test_a_ramp_is_counted_by_its_samples():
    """Ramp [4, 4, 24] to 8: steps of 4 until 24 samples, then 8. A warm-up of 12 samples and a
    linear decay to sample 60: by hand from the samples before each step."""
    t = run(9, ramp=[4, 4, 24])
    cfg = opt(lr=1.0, min_lr=0.0, lr_warmup_samples=12, lr_decay_samples=60,
              lr_decay_style="linear")
    got, sched = rates(cfg, t)
    before = [0, 4, 8, 12, 16, 20, 24, 32, 40]
    want = [4 / 12, 8 / 12, 1.0] + [1 - (b - 12) / 48 for b in before[3:]]
    assert got == pytest.approx(want, rel=1e-12)
    assert sched.samples == 48 == t.samples_over(0, 9)
    # a warm-up a large step overshoots ends at lr, never above it
    assert lr_at(8, opt(lr=1.0, lr_warmup_samples=10), 100, 8) == 1.0


def test_a_skipped_step_counts_no_samples():
    """fp16's overflow skips the update, and DeepSpeed does not step the scheduler: the next
    step gets the rate the skipped one had (as Megatron-LM's scheduler does)."""
    cfg = opt(lr=1.0, min_lr=0.0, lr_warmup_samples=32, lr_decay_style="constant")
    got, sched = rates(cfg, run(4), skipped={1})
    assert got == [0.25, 0.5, 0.5, 0.75]
    assert (sched.last_step, sched.samples) == (3, 24)


def test_the_count_is_checkpointed_and_an_older_record_is_full_batches():
    t = run(10, ramp=[4, 4, 12])
    cfg = opt(lr=1.0, min_lr=0.0, lr_warmup_samples=40)
    _, sched = rates(cfg, t, steps=5)
    state = sched.state_dict()
    assert (state["last_step"], state["samples"], state["unit"]) == (5, 28, "samples")
    again = scheduler(cfg, t)
    again.load_state_dict(state)
    again.set_batch(8)
    assert again.get_last_lr()[0] == pytest.approx(36 / 40)  # samples 28 + 8 of the warm-up
    old = {k: v for k, v in state.items() if k != "samples"}
    again.load_state_dict(old)
    assert again.samples == 5 * 8  # five steps of the full batch


def test_a_resume_that_changes_what_the_schedule_counts_is_named():
    t = run(10)
    by_steps = opt(lr=1.0, min_lr=0.0, lr_warmup_iters=2, lr_decay_style="linear")
    _, sched = rates(by_steps, t, steps=4)
    saved = sched.state_dict()
    assert schedule_change(saved, by_steps, t, 32) is None
    by_samples = opt(lr=1.0, min_lr=0.0, lr_warmup_samples=16, lr_decay_style="linear")
    assert schedule_change(saved, by_samples, t, 32) is not None  # same rates, another unit
    changed, before, after, text = schedule_change(saved, by_samples, t, 32)
    assert changed["unit"] == ["steps", "samples"] and changed["warmup_samples"] == [None, 16]
    assert changed["decay_samples"] == [None, 80] and "warmup_iters" in changed
    # step 5 at sample 32: 2/8 of the decay either way
    assert before == after == pytest.approx(0.75)
    assert "what the schedule counts steps -> samples" in text


def test_training_longer_while_counting_samples_names_lr_decay_samples():
    cfg = opt(lr=1.0, min_lr=0.0, lr_warmup_samples=16, lr_decay_style="linear")
    _, sched = rates(cfg, run(10), steps=4)
    changed, before, after, text = schedule_change(sched.state_dict(), cfg, run(20), 32)
    assert changed == {"decay_samples": [80, 160]}
    assert before == pytest.approx(1 - 16 / 64) and after == pytest.approx(1 - 16 / 144)
    assert text.endswith("(min_lr after the sample 80), set optimizer.lr_decay_samples=80")


@pytest.mark.parametrize("overrides, field, expected", [
    (["optimizer.lr_warmup_samples=64", "optimizer.lr_warmup_iters=5"],
     "optimizer.lr_warmup_iters=5", "unset while optimizer.lr_warmup_samples is set"),
    (["optimizer.lr_decay_samples=640", "optimizer.lr_decay_iters=100"],
     "optimizer.lr_decay_iters=100", "unset while optimizer.lr_decay_samples is set"),
    (["optimizer.lr_decay_samples=0"], "optimizer.lr_decay_samples=0", "a positive number"),
    (["optimizer.lr_warmup_samples=-8"], "optimizer.lr_warmup_samples=-8", "a non-negative"),
    (["optimizer.lr_decay_style=wsd", "optimizer.lr_decay_samples=640"],
     "optimizer.lr_wsd_decay_samples=None", "the decay's length in samples with"),
])
def test_mixed_or_out_of_range_settings_are_refused(overrides, field, expected):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert str(err.value).startswith(f"{field} is invalid") and expected in str(err.value)


def test_wsds_decay_in_samples_must_fit_after_the_warm_up():
    """train_iters=10 at batch 8: 80 samples; a warm-up of 16 leaves 64 for the decay."""
    base = ["training.train_iters=10", "training.global_batch_size=8",
            "training.micro_batch_size=2", "optimizer.lr_decay_style=wsd",
            "optimizer.lr_warmup_samples=16"]
    validate_for_world(load_config(None, base + ["optimizer.lr_wsd_decay_samples=64"]), 4)
    with pytest.raises(ConfigError, match=r"optimizer.lr_wsd_decay_samples=72 is invalid: "
                                          r"expected at most the decay's end \(the samples of "
                                          r"training.train_iters=10 steps=80\) minus "
                                          r"optimizer.lr_warmup_samples=16, 64"):
        validate_for_world(load_config(None, base + ["optimizer.lr_wsd_decay_samples=72"]), 4)


def test_unread_sample_settings_are_named():
    cfg = load_config(None, ["optimizer.lr_decay_style=constant",
                             "optimizer.lr_decay_samples=800",
                             "optimizer.lr_wsd_decay_samples=80"])
    named = " ".join(unread_settings(cfg))
    assert "optimizer.lr_decay_samples" in named and "optimizer.lr_wsd_decay_samples" in named
    assert math.isclose(lr_at(0, cfg.optimizer, 10, 8), 1e-3)  # constant: lr throughout


def test_a_run_of_train_samples_decays_to_them_not_to_its_last_steps_samples():
    """60 samples at a global batch of 8 take 8 steps (64 samples); Megatron-LM's decay ends at
    --train-samples when --lr-decay-samples is not given: a linear decay from sample 0 to 60."""
    t = load_config(None, ["training.global_batch_size=8", "training.micro_batch_size=2",
                           "training.train_iters=null", "training.train_samples=60"]).training
    assert t.train_iters == 8
    got, _ = rates(opt(lr=1.0, min_lr=0.0, lr_warmup_samples=0, lr_decay_style="linear"), t)
    assert got == pytest.approx([max(0.0, 1 - 8 * i / 60) for i in range(8)], rel=1e-12)
