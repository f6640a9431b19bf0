"""The loop's own clocks: the job's deadline (exit_duration_minutes or the batch job's end time)
stops a run while one more step and a save still fit; wall-clock saves fall due."""
import pytest

from megatron.config.errors import ConfigError, InputError
from megatron.training.clock import SAFETY, Deadline, job_end


class FakeTime:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def test_the_earliest_deadline_wins_and_is_named():
    env = {"MEGATRON_JOB_END_TIME": "1600", "SLURM_JOB_END_TIME": "1500"}
    assert job_end(10, env, 1000.0) == (1500.0, "SLURM_JOB_END_TIME=1500")
    assert job_end(5, env, 1000.0) == (1300.0, "training.exit_duration_minutes=5")
    assert job_end(0, {}, 1000.0) == (None, None)


@pytest.mark.parametrize("value", ["soon", "nan", "inf", "-inf", "\u0661\u0665\u0660\u0660"])
def test_a_bad_end_time_is_one_message(value):
    """nan was taken (every comparison with it is false: the run never stopped for its job's
    end), and so were other scripts' digits."""
    with pytest.raises(InputError, match=f"MEGATRON_JOB_END_TIME='{value}' is not a time"):
        job_end(0, {"MEGATRON_JOB_END_TIME": value}, 0.0)


def test_stops_once_a_step_and_a_save_no_longer_fit():
    now = FakeTime(1000.0)
    d = Deadline(0, 0.0, {"MEGATRON_JOB_END_TIME": "1100"}, now)
    assert not d.reached()  # no step measured yet: nothing to go by
    d.step_took(10.0)
    d.save_took(20.0)
    assert d.needed() == pytest.approx(SAFETY * 30.0)
    now.t = 1100 - SAFETY * 30.0 - 0.1
    assert not d.reached()
    now.t += 0.2
    assert d.reached()
    assert "before the deadline (MEGATRON_JOB_END_TIME=1100)" in d.reason()


def test_the_slowest_recent_step_counts_and_an_unmeasured_save_is_a_step():
    now = FakeTime(0.0)
    d = Deadline(1, 0.0, {}, now)  # 60 s from the start
    for s in (1.0, 5.0, 2.0):
        d.step_took(s)
    assert d.needed() == pytest.approx(SAFETY * 10.0)
    now.t = 60 - SAFETY * 10.0 + 0.01
    assert d.reached()


def test_no_deadline_never_stops():
    d = Deadline(0, 0.0, {}, FakeTime(1e12))
    d.step_took(1.0)
    assert not d.reached()


def test_a_save_this_job_has_not_made_yet_counts_as_expected_not_as_a_step():
    """Issue 20 item 5: with 20 s saves and 0.15 s steps, a save taken as one step started the
    stop save 0.3 s before the deadline and committed 19.5 s after it."""
    now = FakeTime(1000.0)
    d = Deadline(0, 0.0, {"MEGATRON_JOB_END_TIME": "1030"}, now)
    d.step_took(0.15)
    assert not d.reached()  # one step as the save: 0.36 s needed, 30 s left
    d.expect_save(20.0, "the run's last save")
    assert d.needed() == pytest.approx(SAFETY * 20.15)
    now.t = 1030 - SAFETY * 20.15 + 0.01
    assert d.reached()
    d.save_took(5.0)  # a save this job measured replaces the expectation
    assert d.needed() == pytest.approx(SAFETY * 5.15)


def test_the_exit_has_its_own_reserve_after_the_last_save():
    """Stop 46's CI: the run stopped 2.0 s before a Slurm job's end with room for a step and a
    save but none for its own exit, and the loaded machine took longer than 1 s to exit; Slurm
    recorded TIMEOUT. exit_reserve_seconds is added after the scaled step and save."""
    now = FakeTime(1000.0)
    d = Deadline(0, 0.0, {"MEGATRON_JOB_END_TIME": "1100"}, now, reserve=15.0)
    d.step_took(10.0)
    d.save_took(20.0)
    assert d.needed() == pytest.approx(SAFETY * 30.0 + 15.0)
    now.t = 1100 - SAFETY * 30.0 - 15.0 - 0.1
    assert not d.reached()
    now.t += 0.2
    assert d.reached()
    assert "and 15 s kept for the exit" in d.reason()


def test_the_exit_reserve_is_checked_and_defaults_to_some_room():
    from megatron.config.sections.training import TrainingConfig
    assert TrainingConfig().exit_reserve_seconds > 0
    with pytest.raises(ConfigError, match="training.exit_reserve_seconds=-1.0 is invalid"):
        TrainingConfig(exit_reserve_seconds=-1.0)


def test_inside_a_batch_ramp_the_room_kept_is_the_next_larger_steps():
    """A 10 s step of a ramp whose next batch is twice as large: one more step needs 20 s."""
    d = Deadline(0, 0.0, {"MEGATRON_JOB_END_TIME": "1100"}, FakeTime(1000.0))
    d.step_took(10.0, growth=2.0)
    d.save_took(5.0)
    assert d.needed() == pytest.approx(SAFETY * 25.0)
