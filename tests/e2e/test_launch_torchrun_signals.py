"""Signals sent to torchrun itself, not to its workers (`kill -USR1 <torchrun>`, a batch script's
`#SBATCH --signal=B:USR1@...`). torchrun does not handle SIGUSR1: it dies and, before
megatron/launch/lifetime.py, left its workers training on as orphans that the time limit then
killed without a checkpoint. Now each worker gets SIGTERM when its agent dies, checkpoints at
the next step boundary and exits."""
import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.e2e.e2e_helpers import ROOT, TINY, RunEnv, set_args, train_steps
from tests.support.procs import torchrun_cmd

pytestmark = pytest.mark.slow

COMMITTED = re.compile(r"^step_\d{7,}$")


def _children(pid: int):
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(entry))
    return kids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


@contextlib.contextmanager
def _torchrun_job(tmp_path, steps: int):
    """torchrun training 2 workers until `steps` steps are logged; yields (agent, its workers,
    run_dir, the output file); whatever is left running is killed afterwards."""
    run_env, run_dir = RunEnv(tmp_path), tmp_path / "run"
    out_path = tmp_path / "torchrun.out"
    out = open(out_path, "w")
    cmd = [*torchrun_cmd(2), "-m", "megatron.cli.train", "--config", TINY]
    cmd += set_args("training.train_iters=100000", "training.global_batch_size=4",
                    "training.tensorboard=false", f"run.dir={run_dir}")
    agent = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=run_env.env,
                             cwd=ROOT)
    workers = []
    try:
        metrics = run_dir / "metrics.jsonl"
        _wait_for(lambda: metrics.exists() and len(train_steps(str(run_dir))) >= steps, 180,
                  f"{steps} logged step(s)")
        workers += _children(agent.pid)
        yield agent, workers, run_dir, out_path
    finally:
        if agent.poll() is None:
            agent.kill()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        out.close()


def _newest_committed(run_dir, log: str) -> int:
    ckpt = run_dir / "checkpoints"
    saved = [p for p in os.listdir(ckpt) if COMMITTED.match(p)] if ckpt.exists() else []
    assert saved, f"no checkpoint committed; output:\n{log[-4000:]}"
    return max(int(p.split("_")[1]) for p in saved)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; prctl is Linux")
def test_sigusr1_to_torchrun_checkpoints_and_stops_the_workers(tmp_path):
    with _torchrun_job(tmp_path, 1) as (agent, workers, run_dir, out):
        assert len(workers) == 2, workers
        agent.send_signal(signal.SIGUSR1)
        assert agent.wait(timeout=30) == -signal.SIGUSR1  # torchrun died, forwarding nothing
        _wait_for(lambda: not any(_alive(w) for w in workers), 120,
                  "the orphaned workers to checkpoint and exit")
        last = _newest_committed(run_dir, out.read_text())
        assert last >= max(train_steps(str(run_dir))), "the checkpoint is older than training"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT], ids=["SIGHUP", "SIGINT"])
def test_a_hangup_or_ctrl_c_to_torchrun_checkpoints_through_the_workers(tmp_path, sig):
    """torchrun forwards SIGHUP and SIGINT to its workers (issue 21 item 1: a dropped ssh
    session killed them at once, every step since the last save lost); each worker now takes it
    as a request to checkpoint at the next step boundary (a Ctrl-C counts once, however many
    times it arrives in two seconds), and the run's newest checkpoint is its last step."""
    with _torchrun_job(tmp_path, 2) as (agent, workers, run_dir, out):
        agent.send_signal(sig)
        agent.wait(timeout=120)  # torchrun's own status after a signal: 1 (SignalException)
        _wait_for(lambda: not any(_alive(w) for w in workers), 60, "the workers to exit")
        log = out.read_text()
        assert f"{sig.name} received: checkpointing" in log, log[-4000:]
        last = _newest_committed(run_dir, log)
        assert last == max(train_steps(str(run_dir))), "steps after the checkpoint were lost"
        assert "again: stopping now" not in log
