"""What each signal does to one megatron-train process (training/signals.py): SIGHUP (a dropped
ssh session), SIGQUIT and a first Ctrl-C checkpoint at the next step boundary, write a stop event
and exit 0, so the run continues from there; a second Ctrl-C stops at once, without a checkpoint,
with exit status 130 (tests/unit/test_training_signals.py). (SIGTERM and SIGUSR1 under torchrun and Slurm: tests/e2e.) Before, SIGHUP
killed the process at once and every step since the last save was lost."""
import signal
import subprocess
import time

import pytest

from megatron.base import store
from megatron.base.records import events, read_metrics, steps
from megatron.base.rundir import RunDir
from tests.support.cli import clean_env, sets, train_cmd
from tests.support.paths import ROOT, TINY

LONG = ["training.train_iters=100000", "training.tensorboard=false", "model.num_layers=2",
        "training.global_batch_size=4", "training.micro_batch_size=2"]


def _start(run):
    return subprocess.Popen(train_cmd("--config", TINY, *sets(f"run.dir={run}", *LONG)),
                            cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for_steps(run, proc, n=3, timeout=120):
    metrics = RunDir(str(run)).metrics
    end = time.time() + timeout
    while time.time() < end:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        try:
            if len(steps(read_metrics(metrics))) >= n:
                return
        except FileNotFoundError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the run did not reach its steps")


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT, signal.SIGINT],
                         ids=["SIGHUP", "SIGQUIT", "SIGINT"])
def test_the_signal_checkpoints_and_stops_with_status_0(tmp_path, sig):
    run = tmp_path / "run"
    proc = _start(run)
    _wait_for_steps(run, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and f"{sig.name} received" in err
    lines = read_metrics(RunDir(str(run)).metrics)
    last = steps(lines)[-1].step
    assert [e.reason for e in events(lines, "stop")] == ["signal"]
    assert [e.step for e in events(lines, "save")] == [last]
    assert store.validate(str(run / "checkpoints" / store.tag_for(last))).step == last
