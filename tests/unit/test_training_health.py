"""The divergence guard's decisions, step by step: a non-finite loss stops at once; skips stop
only past their limit and by cause (fp16 overflows apart from non-finite gradients); a spike
above its running median is logged, stops or rolls back as configured."""
import pytest

from megatron.config import load_config
from megatron.config.errors import ConfigError
from megatron.training.health import OK, ROLLBACK, STOP, DivergenceGuard


def guard(fp16=False, **sets):
    cfg = load_config(None, [f"resilience.{k}={v}" for k, v in sets.items()])
    return DivergenceGuard(cfg.resilience, fp16)


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_loss_stops_at_once(loss):
    v = guard().observe(7, loss, skipped=False)
    assert v.action == STOP and "step 7: the loss is" in v.reason


def test_non_finite_gradient_skips_stop_past_their_limit_and_reset_on_a_good_step():
    g = guard(max_skipped_steps=2)
    assert [g.observe(s, 1.0, True).action for s in (1, 2)] == [OK, OK]
    assert g.observe(3, 1.0, False).action == OK  # counted consecutively
    assert [g.observe(s, 1.0, True).action for s in (4, 5)] == [OK, OK]
    v = g.observe(6, 1.0, True)
    assert v.action == STOP and "3 consecutive steps skipped for non-finite gradients" in v.reason


def test_fp16_overflow_skips_have_their_own_limit():
    g = guard(fp16=True, max_skipped_steps=0, max_loss_scale_skips=3)
    assert [g.observe(s, 1.0, True).action for s in range(1, 4)] == [OK] * 3
    v = g.observe(4, 1.0, True)
    assert v.action == STOP and "fp16 loss-scale overflows" in v.reason


@pytest.mark.parametrize("action, expected", [("log", OK), ("stop", STOP),
                                              ("rollback", ROLLBACK)])
def test_a_spike_above_the_running_median(action, expected):
    g = guard(loss_spike_factor=2.0, loss_spike_window=10, loss_spike_action=action)
    for s in range(10):
        assert g.observe(s, 3.0 - 0.01 * s, False).action == OK
    assert g.observe(10, 5.0, False).action == OK  # below 2 x median
    v = g.observe(11, 7.0, False)
    assert v.spike and v.action == expected and "above 2 x its running median" in v.reason
    assert g.observe(12, 2.9, False).action == OK  # the spike did not enter the median


def test_no_spike_before_the_window_has_history():
    g = guard(loss_spike_factor=1.5, loss_spike_window=10, loss_spike_action="stop")
    assert g.observe(0, 3.0, False).action == OK
    assert g.observe(1, 100.0, False).action == OK


@pytest.mark.parametrize("key, value", [("loss_spike_factor", "0.5"),
                                        ("loss_spike_action", "ignore"),
                                        ("max_skipped_steps", "-1"),
                                        ("loss_spike_window", "0")])
def test_bad_guard_settings_are_refused(key, value):
    with pytest.raises(ConfigError, match=f"resilience.{key}"):
        load_config(None, [f"resilience.{key}={value}"])


def test_suspicious_says_what_observe_would_call_a_spike_without_counting_it():
    """training/sdc.py asks before the update; the history observe() keeps is unchanged."""
    g = guard(loss_spike_factor=2.0, loss_spike_window=10)
    assert not g.suspicious(100.0)  # not warm yet: no median to compare with
    for s in range(10):
        g.observe(s, 1.0, False)
    history = list(g.history)
    assert g.suspicious(2.5) and g.suspicious(float("nan")) and not g.suspicious(1.5)
    assert list(g.history) == history
    assert g.observe(11, 2.5, False).spike


def test_rerun_suspect_steps_is_refused_under_pipeline_parallelism():
    from megatron.config import validate_for_world
    cfg = load_config(None, ["training.rerun_suspect_steps=true", "resilience.loss_spike_factor=3",
                             "parallel.pipeline_parallel_size=2", "model.num_layers=2"])
    with pytest.raises(ConfigError, match="resilience.rerun_suspect_steps=True is invalid: "
                                          "expected false under pipeline parallelism"):
        validate_for_world(cfg, 2)


def test_rerun_suspect_steps_without_a_spike_factor_is_refused_naming_both_fields():
    """Issue 40 item 4: rerun_suspect_steps=true with loss_spike_factor 0 re-ran only
    non-finite losses, and no text said so; now it is one message naming both fields."""
    with pytest.raises(ConfigError) as e:
        load_config(None, ["resilience.rerun_suspect_steps=true"])
    msg = str(e.value)
    assert msg.startswith("resilience.loss_spike_factor=0.0 is invalid: expected a factor "
                          "above 1 with resilience.rerun_suspect_steps=true"), msg
    assert "resilience.rerun_suspect_steps=false" in msg and "e.g. 3.0" in msg, msg
    cfg = load_config(None, ["resilience.rerun_suspect_steps=true",
                             "resilience.loss_spike_factor=3"])
    assert cfg.resilience.rerun_suspect_steps and cfg.resilience.loss_spike_factor == 3.0
