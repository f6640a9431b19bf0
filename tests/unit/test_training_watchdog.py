"""The hang watchdog's limits and what it leaves when it fires (training/watchdog.py): start-up
and each kind of phase's first run get the start-up allowance, later ones the floor or FACTOR x
the slowest measured, a save FACTOR x its expected cost; past the limit the stacks and a hang event land in the run directory and
the rank exits EXIT_HANG. The real hang (a stopped peer under torchrun):
tests/integration/test_training_watchdog_hang.py."""
import time

import pytest

from megatron.base.records import HangEvent, UnresponsiveEvent, events, read_metrics
from megatron.base.rundir import RunDir
from megatron.training import watchdog as wd
from megatron.training.watchdog import EXIT_HANG, FACTOR, MARGIN_S, Watchdog, job_stamp


def test_limits_start_up_first_phases_then_measured():
    dog = Watchdog(RunDir("unused"), 0, startup_s=600, floor_s=30)
    assert dog.limit("start-up") == 600 and dog.limit("step") == 600
    dog.enter("step", 1)
    dog.since -= 2.0  # the first step took 2 s
    dog.done()
    assert dog.longest["step"] >= 2.0 and dog.phase is None
    assert dog.limit("step") == 30  # the floor: 5 x 2 s is less
    assert dog.limit("save") == 600  # no save measured yet
    dog.longest["step"] = 20.0
    assert dog.limit("step") == FACTOR * 20.0
    assert Watchdog(RunDir("x"), 0, 0, 0).on is False


def test_a_phase_past_its_limit_leaves_stacks_and_an_event_and_exits(tmp_path, monkeypatch):
    run = RunDir(str(tmp_path))
    exits = []
    dog = Watchdog(run, 3, startup_s=0.3, floor_s=0.3, poll_s=0.05, exit=exits.append)
    with dog:
        dog.enter("agreement", 7)
        deadline = time.monotonic() + 10
        while not exits and time.monotonic() < deadline:
            time.sleep(0.05)
    assert exits == [EXIT_HANG]
    stacks = open(run.hang_stacks(dog.job, 3)).read()
    assert "agreement of step 7" in stacks and "Thread" in stacks and "test_training_watchdog" \
        in stacks  # this test's main thread, where it waited
    (hang,) = events(read_metrics(run.metrics), "hang")
    assert isinstance(hang, HangEvent) and (hang.rank, hang.phase, hang.step) == (3, "agreement", 7)


def test_a_phase_within_its_limit_never_fires(tmp_path):
    exits = []
    with Watchdog(RunDir(str(tmp_path)), 0, 1.0, 1.0, poll_s=0.02, exit=exits.append) as dog:
        for step in range(5):
            dog.enter("step", step)
            time.sleep(0.05)
            dog.done()
    assert not exits and not (tmp_path / "hangs").exists()
    assert wd.POLL_S >= 0.5  # the thread wakes rarely in real runs


def test_gpu_runs_turn_the_flight_recorder_on_into_the_hangs_folder(tmp_path):
    from megatron.training.startup import flight_recorder_env
    run = RunDir(str(tmp_path / "run"))
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}  # the user's choice stays
    flight_recorder_env(run, env)
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "50" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"].startswith(run.hangs)
    assert (tmp_path / "run" / "hangs").is_dir()


def _fire_until_exit(dog, phase, step):
    exits = []
    dog._exit = exits.append
    with dog:
        dog.enter(phase, step)
        deadline = time.monotonic() + 20
        while not exits and time.monotonic() < deadline:
            time.sleep(0.05)
    return exits


def test_ranks_that_never_report_are_named_and_their_nodes_left_out(tmp_path, monkeypatch):
    """Ranks 0 and 2 of 4 hang in one collective and report; rank 1 (stopped) and rank 3 never
    do: after the grace period rank 0 names them, writes one unresponsive event, and puts their
    nodes into bad_nodes for the chain."""
    monkeypatch.setattr(wd, "grace_s", lambda limit: 0.5)
    run = RunDir(str(tmp_path))
    dog = Watchdog(run, 0, startup_s=0.3, floor_s=0.3, poll_s=0.05)
    dog.join(["n1", "n1", "n2", "n3"], 1.8e9)
    assert dog.job == job_stamp(1.8e9) == "job-20270115T080000Z"
    other = run.hang_stacks(dog.job, 2)  # rank 2's report, written beside ours
    import os
    os.makedirs(os.path.dirname(other))
    open(other, "w").write("rank 2 ...")
    assert _fire_until_exit(dog, "agreement", 12) == [EXIT_HANG]
    records = read_metrics(run.metrics)
    (gone,) = events(records, "unresponsive")
    assert isinstance(gone, UnresponsiveEvent)
    assert (gone.step, gone.ranks, gone.nodes, gone.phase, gone.reported) == \
        (12, [1, 3], ["n1", "n3"], "agreement", 2)
    assert run.read_bad_nodes() == ["n1", "n3"]
    assert "rank(s) 1 stopped answering in step 12" in open(run.bad_nodes).read()
    summary = open(run.hang_summary(dog.job)).read()
    assert "1 (n1), 3 (n3) never reported" in summary


def test_when_every_rank_reports_no_node_is_blamed(tmp_path, monkeypatch):
    monkeypatch.setattr(wd, "grace_s", lambda limit: 0.2)
    run = RunDir(str(tmp_path))
    dog = Watchdog(run, 1, startup_s=0.3, floor_s=0.3, poll_s=0.05)
    dog.join(["a", "b"], 1.8e9)
    import os
    os.makedirs(os.path.dirname(run.hang_stacks(dog.job, 0)))
    open(run.hang_stacks(dog.job, 0), "w").write("rank 0 ...")
    assert _fire_until_exit(dog, "save", 3) == [EXIT_HANG]
    assert events(read_metrics(run.metrics), "unresponsive") == []
    assert run.read_bad_nodes() == []
    assert "all 2 ranks hung in step 3" in open(run.hang_summary(dog.job)).read()


def test_the_process_groups_timeout_follows_the_phase_limit():
    """Start-up and first phases: the start-up allowance plus the margin; once measured, the
    steady limit plus the margin; set only when it changes (nothing per step in steady state)."""
    applied = []
    dog = Watchdog(RunDir("unused"), 0, startup_s=1800, floor_s=300)
    dog.join(["n"], 0.0, applied.append, base_s=600)
    dog.enter("step", 1)
    assert applied == [1800 + MARGIN_S]
    dog.done()
    dog.enter("step", 2)
    assert applied == [1800 + MARGIN_S, 300 + MARGIN_S]
    for step in range(3, 10):
        dog.enter("step", step)
        dog.done()
    assert len(applied) == 2  # steady state: no call at all
    off = Watchdog(RunDir("unused"), 0, 0, 0)
    off.join(["n"], 0.0, applied.append, base_s=600)
    off.enter("step", 1)
    assert len(applied) == 2  # the watchdog off: parallel.timeout_minutes stays


def test_a_first_real_save_without_an_expected_cost_gets_the_start_up_allowance():
    """The loop's after-step phase runs every step; "save" is entered only by a real save
    (training/checkpointer.py), so steps without one leave its allowance at start-up's when
    nothing says what a save costs."""
    dog = Watchdog(RunDir("unused"), 0, startup_s=1800, floor_s=300)
    for step in range(1, 50):
        dog.enter("step", step)
        dog.done()
        dog.enter("after-step")
        dog.done()
    assert dog.limit("after-step") == 300 and dog.limit("save") == 1800
    dog.enter("save")
    dog.since -= 100.0  # the first save took 100 s
    dog.done()
    assert dog.limit("save") == pytest.approx(FACTOR * 100.0, abs=0.1)


def test_a_saves_limit_follows_its_expected_cost_from_the_first_save_on():
    """Issue 40 item 1: the first save is held to FACTOR x the estimate (at least the floor),
    not to start-up's 30 minutes; and an asynchronous save, whose phase that starts it is short,
    is held at its commit to FACTOR x the whole save's measured cost, not to FACTOR x that
    short phase (a healthy save slower than the floor used to exit 4)."""
    dog = Watchdog(RunDir("unused"), 0, startup_s=1800, floor_s=6)
    dog.expect("save", 2.0)  # the estimate of an unmeasured save
    assert dog.limit("save") == FACTOR * 2.0  # 10 s: a stuck first save is named then
    dog.expect("save", 0.5)
    assert dog.limit("save") == 6  # never under the floor
    dog.enter("save")  # an asynchronous save: the snapshot starts, 0.05 s
    dog.since -= 0.05
    dog.done()
    dog.expect("save", 40.0)  # the first save measured start to commit: 40 s in the background
    assert dog.limit("save") == FACTOR * 40.0  # its commit may wait for the writer that long
    assert dog.limit("load") == 1800  # other phases keep their rule
