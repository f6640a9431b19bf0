"""engine/optimizer.schedule_change: a checkpoint records its learning-rate schedule beside its
position, and a resume under other settings is named with the rate the next step gets under each
(a hand calculation here); a checkpoint from before the record is left alone; the event reads
back from metrics.jsonl and megatron-report describes it."""
import math
from types import SimpleNamespace

import pytest
import torch

from megatron.base.records import LrScheduleEvent, parse_metrics_line, record_json
from megatron.config.sections.training import TrainingConfig
from megatron.engine.optimizer import WarmupDecayLR, schedule_change

BATCH = 8


def opt(**kw):
    base = dict(lr=3e-3, min_lr=3e-4, lr_warmup_iters=2, lr_decay_style="cosine",
                lr_decay_iters=None, lr_wsd_decay_iters=None, lr_wsd_decay_style="1-sqrt",
                lr_warmup_samples=None, lr_decay_samples=None, lr_wsd_decay_samples=None)
    return SimpleNamespace(**{**base, **kw})


def run(train_iters, ramp=None):
    return TrainingConfig(train_iters=train_iters, global_batch_size=BATCH, micro_batch_size=2,
                          rampup_batch_size=ramp)


def saved_at(step, cfg, train_iters, ramp=None):
    t = run(train_iters, ramp)
    sched = WarmupDecayLR(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), cfg, t)
    consumed = 0
    for _ in range(step):
        sched.set_batch(t.global_batch_at(consumed))
        consumed += sched.batch
        sched.step()
    return sched.state_dict()


def change(saved, cfg, train_iters, ramp=None):
    t = run(train_iters, ramp)
    return schedule_change(saved, cfg, t, t.samples_over(0, saved["last_step"]))


def test_the_same_schedule_is_no_change_and_an_old_record_is_not_judged():
    saved = saved_at(4, opt(), 4)
    assert saved["last_step"] == 4 and saved["decay_iters"] == 4
    assert change(saved, opt(), 4) is None
    assert change(saved, opt(lr_decay_iters=4), 8) is None  # the same end, set
    assert change({"last_step": 4}, opt(lr=1.0), 99) is None  # before the record


def test_training_longer_moves_the_decays_end_and_names_the_setting_that_keeps_it():
    changed, before, after, text = change(saved_at(4, opt(), 4), opt(), 8)
    assert changed == {"decay_iters": [4, 8]}
    assert before == pytest.approx(3e-4)  # step 5 is past the end of a 4-step decay: min_lr
    # cosine from step 2 (after warm-up) to 8, at step 4: 1/3 of the way
    assert after == pytest.approx(3e-4 + 2.7e-3 * 0.5 * (1 + math.cos(math.pi / 3)))
    assert "step 5 trains at lr 0.00232" in text and "gives 0.0003" in text
    assert text.endswith("set optimizer.lr_decay_iters=4")


def test_a_wsd_checkpoint_from_the_stable_part_cools_down_later_at_the_same_rate():
    """WSD's use: a checkpoint from the stable part continued with a later end; the next step
    trains at lr under both schedules, and the two part where the shorter one's decay begins."""
    wsd = opt(lr_decay_style="wsd", lr_wsd_decay_iters=4)
    saved = saved_at(5, wsd, 10)  # the decay would begin at step 6
    assert (saved["wsd_decay_iters"], saved["wsd_decay_style"]) == (4, "1-sqrt")
    changed, before, after, text = change(saved, wsd, 20)
    assert changed == {"decay_iters": [10, 20]}
    assert before == after == pytest.approx(3e-3)
    assert "step 6 trains at lr 0.003 under both" in text
    # a longer decay at the same end is named with its own setting and the rates it gives:
    # 1-sqrt from step 4 to 10 (6 steps), at step 5: r = 1/6
    changed, before, after, text = change(saved, opt(lr_decay_style="wsd",
                                                     lr_wsd_decay_iters=6), 10)
    assert changed == {"wsd_decay_iters": [4, 6]}
    assert before == pytest.approx(3e-3)
    assert after == pytest.approx(3e-4 + 2.7e-3 * (1 - math.sqrt(1 / 6)))
    assert "optimizer.lr_wsd_decay_iters 4 -> 6" in text


def test_a_record_from_before_wsd_compares_as_it_did():
    """Checkpoints written before wsd's keys existed hold the five others: the same schedule is
    no change, and the wsd keys are not named for schedules that do not read them."""
    saved = {k: v for k, v in saved_at(4, opt(), 8).items() if not k.startswith("wsd_")}
    assert change(saved, opt(), 8) is None
    assert change(saved, opt(lr_wsd_decay_iters=3), 8) is None  # unread by cosine
    changed, _, _, _ = change(saved, opt(lr_decay_style="wsd", lr_wsd_decay_iters=3), 8)
    assert changed == {"decay_style": ["cosine", "wsd"], "wsd_decay_iters": [None, 3]}


@pytest.mark.parametrize("style, unread", [("constant", {"min_lr": 1e-5, "lr_decay_iters": 50}),
                                           ("inverse-square-root", {"lr_decay_iters": 50})])
def test_settings_a_style_does_not_read_are_no_change(style, unread):
    """A constant or inverse-square-root run continued with a longer train_iters (the decay's end
    they do not have) or another unread setting trains every step at the same rate: no warning.
    What they read still counts, and a change of style compares what either reads."""
    cfg = opt(lr_decay_style=style)
    saved = saved_at(5, cfg, 10)
    assert change(saved, cfg, 40) is None
    assert change(saved, opt(lr_decay_style=style, **unread), 40) is None
    changed, before, after, _ = change(saved, opt(lr_decay_style=style, lr=1e-3), 40)
    assert changed == {"lr": [3e-3, 1e-3]}
    if style == "inverse-square-root":  # 6 steps taken after a 2-step warm-up
        assert (before, after) == (pytest.approx(3e-3 / math.sqrt(3)),
                                   pytest.approx(1e-3 / math.sqrt(3)))
    changed, _, _, _ = change(saved, opt(), 40)  # to cosine, which reads the end
    assert changed["decay_style"] == [style, "cosine"] and changed["decay_iters"] == [10, 40]


def test_a_new_peak_is_named_without_the_decay_hint():
    changed, before, after, text = change(saved_at(1, opt(), 10), opt(lr=1e-3), 10)
    assert changed == {"lr": [3e-3, 1e-3]}
    assert (before, after) == (pytest.approx(3e-3), pytest.approx(1e-3))  # warm-up's 2nd step
    assert "optimizer.lr 0.003 -> 0.001" in text and "lr_decay_iters=" not in text


def test_the_event_reads_back_and_the_report_describes_it():
    from megatron.training.report import _detail
    event = LrScheduleEvent(4, "decay_iters 4 -> 8", 3e-4, 2.325e-3)
    line = record_json(event)
    assert line["event"] == "lr_schedule" and parse_metrics_line(line) == event
    assert "0.0003 -> 0.00232" in _detail(event)
