"""The start-up clock (megatron/launch/startup.py): the process's launch time from /proc, and
phases that add up to the time from launch to the first step."""
import time

from megatron.launch.startup import StartupTimer, process_start_time

IMPORTED = time.time()  # this module's import, during collection


def test_process_start_time_is_this_process_launch():
    """Before this module was imported (at collection), and not long before: the interpreter's
    start to collection is seconds to a minute; a wrong reading of /proc is off by the machine's
    uptime or by clock ticks. Not against the time now: in a full suite this process may be an
    hour old by the time this test runs."""
    started = process_start_time()
    assert started is not None, "Linux /proc should give the launch time"
    assert IMPORTED - 600 < started <= IMPORTED + 0.02, (started, IMPORTED)


def test_phases_add_up_and_repeat_names_accumulate():
    timer = StartupTimer(started=100.0)
    timer.mark("imports", at=101.5)
    timer.mark("model build", at=102.0)
    timer.mark("imports", at=103.0)  # a second stretch of the same phase adds to it
    timer.mark("late", at=102.5)  # a mark in the past closes an empty phase
    assert timer.phases == [("imports", 2.5), ("model build", 0.5), ("late", 0.0)]
    assert timer.total == 3.0
    record = timer.record()
    assert record == {"total_s": 3.0, "phases": {"imports": 2.5, "model build": 0.5, "late": 0.0},
                      "first_step_at": 103.0}
    assert timer.text() == "3.00 s from launch to the first step (imports 2.50, model build 0.50)"


def test_default_origin_is_the_process_launch():
    assert abs(StartupTimer().origin - (process_start_time() or 0)) < 0.05
