"""The start-up clock (megatron/launch/startup.py): the process's launch time from /proc, and
phases that add up to the time from launch to the first step."""
import subprocess
import sys
import time

from megatron.launch.startup import StartupTimer, process_start_time
from tests.support.paths import ROOT


def test_process_start_time_is_this_process_launch():
    """A fresh process reads its own launch, within the time its interpreter takes to start
    (this pytest process may be an hour old by now, so it is not the one asked)."""
    before = time.time()
    out = subprocess.run([sys.executable, "-c", "import time; from megatron.launch.startup import "
                          "process_start_time as p; print(p(), time.time())"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    started, then = float(out[0]), float(out[1])
    assert before - 0.05 <= started <= then, (before, started, then)
    # and this process started before this test, by /proc's 10 ms ticks
    assert process_start_time() <= before + 0.02


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
