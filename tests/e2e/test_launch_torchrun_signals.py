"""Signals sent to torchrun itself, not to its workers (`kill -USR1 <torchrun>`, a batch script's
`#SBATCH --signal=B:USR1@...`). torchrun does not handle SIGUSR1: it dies and, before
megatron/launch/lifetime.py, left its workers training on as orphans that the time limit then
killed without a checkpoint. Now each worker gets SIGTERM when its agent dies, checkpoints at
the next step boundary and exits."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.e2e.e2e_helpers import ROOT, TINY, RunEnv, free_port, set_args, train_steps

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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; prctl is Linux")
def test_sigusr1_to_torchrun_checkpoints_and_stops_the_workers(tmp_path):
    run_env, run_dir = RunEnv(tmp_path), tmp_path / "run"
    out = open(tmp_path / "torchrun.out", "w")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           f"--master_port={free_port()}", "-m", "megatron.cli.train", "--config", TINY]
    cmd += set_args("training.train_iters=100000", "training.global_batch_size=4",
                    "training.tensorboard=false", f"run.dir={run_dir}")
    agent = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=run_env.env,
                             cwd=ROOT)
    workers = []
    try:
        metrics = run_dir / "metrics.jsonl"
        _wait_for(lambda: metrics.exists() and train_steps(str(run_dir)), 180,
                  "the first logged step")
        workers = _children(agent.pid)
        assert len(workers) == 2, workers
        agent.send_signal(signal.SIGUSR1)
        assert agent.wait(timeout=30) == -signal.SIGUSR1  # torchrun died, forwarding nothing
        _wait_for(lambda: not any(_alive(w) for w in workers), 120,
                  "the orphaned workers to checkpoint and exit")
        ckpt = run_dir / "checkpoints"
        saved = [p for p in os.listdir(ckpt) if COMMITTED.match(p)] if ckpt.exists() else []
        log = (tmp_path / "torchrun.out").read_text()
        assert saved, f"no checkpoint committed; output:\n{log[-4000:]}"
        last = max(int(p.split("_")[1]) for p in saved)
        assert last >= max(train_steps(str(run_dir))), "the checkpoint is older than training"
    finally:
        if agent.poll() is None:
            agent.kill()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        out.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT], ids=["SIGHUP", "SIGINT"])
def test_a_hangup_or_ctrl_c_to_torchrun_checkpoints_through_the_workers(tmp_path, sig):
    """torchrun forwards SIGHUP and SIGINT to its workers (issue 21 item 1: a dropped ssh
    session killed them at once, every step since the last save lost); each worker now takes it
    as a request to checkpoint at the next step boundary (a Ctrl-C counts once, however many
    times it arrives in two seconds), and the run's newest checkpoint is its last step."""
    run_env, run_dir = RunEnv(tmp_path), tmp_path / "run"
    out = open(tmp_path / "torchrun.out", "w")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           f"--master_port={free_port()}", "-m", "megatron.cli.train", "--config", TINY]
    cmd += set_args("training.train_iters=100000", "training.global_batch_size=4",
                    "training.tensorboard=false", f"run.dir={run_dir}")
    agent = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=run_env.env,
                             cwd=ROOT)
    workers = []
    try:
        metrics = run_dir / "metrics.jsonl"
        _wait_for(lambda: metrics.exists() and len(train_steps(str(run_dir))) >= 2, 180,
                  "two logged steps")
        workers = _children(agent.pid)
        agent.send_signal(sig)
        agent.wait(timeout=120)  # torchrun's own status after a signal: 1 (SignalException)
        _wait_for(lambda: not any(_alive(w) for w in workers), 60, "the workers to exit")
        log = (tmp_path / "torchrun.out").read_text()
        assert f"{sig.name} received: checkpointing" in log, log[-4000:]
        ckpt = run_dir / "checkpoints"
        saved = [p for p in os.listdir(ckpt) if COMMITTED.match(p)] if ckpt.exists() else []
        assert saved, f"no checkpoint committed; output:\n{log[-4000:]}"
        last = max(int(p.split("_")[1]) for p in saved)
        assert last == max(train_steps(str(run_dir))), "steps after the checkpoint were lost"
        assert "again: stopping now" not in log
    finally:
        if agent.poll() is None:
            agent.kill()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        out.close()
