"""The hang watchdog's limits and what it leaves when it fires (training/watchdog.py): start-up
and each kind of phase's first run get the start-up allowance, later ones the floor or FACTOR x
the slowest measured; past the limit the stacks and a hang event land in the run directory and
the rank exits EXIT_HANG. The real hang (a stopped peer under torchrun):
tests/integration/test_training_watchdog_hang.py."""
import time

from megatron.checkpoint.records import HangEvent, events, read_metrics
from megatron.checkpoint.rundir import RunDir
from megatron.training import watchdog as wd
from megatron.training.watchdog import EXIT_HANG, FACTOR, Watchdog


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
    stacks = (tmp_path / "hangs" / "rank00003.txt").read_text()
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
