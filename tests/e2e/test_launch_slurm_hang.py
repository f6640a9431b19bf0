"""A hung rank under a real Slurm (issue 20 item 1): one task of a 2-task step is stopped
(SIGSTOP) mid-run; its peer's hang watchdog fires after training.hang_timeout_minutes, names the
stopped task and its node after its grace period, and exits 4, and train.sbatch's
--kill-on-bad-exit makes Slurm end the stopped task too, so the job ends within the limit plus
a margin instead of holding the allocation until its time limit
(before: TIMEOUT after 4:28 of a 4-minute limit). The cluster: conftest.py, slurm_cluster.py."""
import os
import signal
import subprocess
import sys
import time

import pytest

from megatron.base.records import events, read_metrics, steps
from megatron.base.rundir import RunDir
from tests.e2e.e2e_helpers import ROOT, TINY, RunEnv
from tests.e2e.slurm_cluster import tail, wait_job
from tests.support.procs import pid_of

pytestmark = pytest.mark.slow

SBATCH = os.path.join(ROOT, "examples", "frontier", "train.sbatch")
KILL = "--kill-on-bad-exit=1"


def _wait_steps(run: RunDir, n: int, timeout: float):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if len(steps(read_metrics(run.metrics))) >= n:
                return
        except FileNotFoundError:
            pass
        time.sleep(0.5)
    pytest.fail(f"the run did not reach step {n} in {timeout:.0f} s")


def test_a_stopped_task_ends_the_job_in_the_timeout_not_the_time_limit(slurm, tmp_path):
    with open(SBATCH) as f:
        assert KILL in f.read(), "train.sbatch's srun line lost --kill-on-bad-exit"
    run_env, run = RunEnv(tmp_path), RunDir(str(tmp_path / "run"))
    out = tmp_path / "job.out"
    script = tmp_path / "job.sbatch"
    script.write_text(f"""#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=5
#SBATCH --output={out}
export MASTER_ADDR=127.0.0.1
srun {KILL} {sys.executable} -m megatron.cli.train --config {TINY} \\
    --set training.train_iters=100000 --set training.global_batch_size=4 \\
    --set parallel.timeout_minutes=1 --set training.hang_timeout_minutes=0.5 \\
    --set training.tensorboard=false --set run.dir={run.path}
""")
    env = dict(run_env.env, SLURM_CONF=slurm["conf"])
    proc = subprocess.run(["sbatch", "--parsable", f"--chdir={ROOT}", str(script)],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    job = int(proc.stdout.strip().split(";")[0])
    try:
        _wait_steps(run, 3, timeout=240)
        pid = pid_of("megatron.cli.train", run.path, env_has="SLURM_PROCID=1")
        assert pid is not None, "no task with SLURM_PROCID=1 found"
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        state, code = wait_job(job, env, timeout=200)
    finally:
        subprocess.run(["scancel", str(job)], env=env, capture_output=True)
    elapsed = time.monotonic() - stopped
    log = tail(out, 10 ** 6)
    assert state == "FAILED", f"job ended {state} {code}; output:\n{log[-4000:]}"
    assert elapsed < 30 + 60, f"the job took {elapsed:.0f} s after the stop to end"
    records = read_metrics(run.metrics)
    # Slurm's termination sends SIGCONT before SIGKILL: the stopped task may run just long
    # enough for its own watchdog to report too, after rank 0 named it.
    assert [h.rank for h in events(records, "hang")][0] == 0, log[-4000:]
    (gone,) = events(records, "unresponsive")  # the stopped task, and its node, are named
    assert gone.ranks == [1] and run.read_bad_nodes() == gone.nodes and len(gone.nodes) == 1
