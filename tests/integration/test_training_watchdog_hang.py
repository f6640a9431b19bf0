"""A stopped rank under torchrun (issue 20, "hangs end fast and say where"): rank 1 of a 2-rank
run gets SIGSTOP mid-run; rank 0's watchdog finds its phase past the 6 s floor
(training.hang_timeout_minutes=0.1) long before the process group's 10-minute timeout, writes
its threads' stacks to <run.dir>/hangs/<job>/ and a hang event naming its rank, host and phase,
names rank 1 as unresponsive after its grace period, and exits 4, after which torchrun ends the
job. Before: nothing until the gloo timeout, then one raw
traceback naming no rank and no phase."""
import os
import signal
import subprocess
import time

import pytest

from megatron.base.records import events, read_metrics, steps
from megatron.base.rundir import RunDir
from tests.support.cli import clean_env, sets
from tests.support.paths import ROOT, TINY
from tests.support.procs import pid_of, torchrun_cmd


@pytest.mark.slow  # torchrun, two ranks and the teardown after the hang: about 45 s
def test_a_stopped_rank_ends_the_job_in_the_hang_limit_with_stacks_and_an_event(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    cmd = [*torchrun_cmd(2), "-m", "megatron.cli.train", "--config", TINY, *sets(
               f"run.dir={run.path}", "training.train_iters=100000", "training.tensorboard=false",
               "training.global_batch_size=4", "model.num_layers=2",
               "training.hang_timeout_minutes=0.1")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=clean_env(OMP_NUM_THREADS="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    stopped = None
    try:
        end = time.monotonic() + 180
        while time.monotonic() < end:
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            try:
                if len(steps(read_metrics(run.metrics))) >= 3:
                    break
            except FileNotFoundError:
                pass
            time.sleep(0.2)
        stopped = pid_of("megatron.cli.train", run.path, env_has="RANK=1")
        assert stopped is not None
        os.kill(stopped, signal.SIGSTOP)
        t0 = time.monotonic()
        out = proc.communicate(timeout=150)[0]
        elapsed = time.monotonic() - t0
    finally:
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0, out[-3000:]
    assert "rank 0 on" in out and "hung:" in out and "exiting 4" in out, out[-3000:]
    assert elapsed < 6 + 60, f"the job ended {elapsed:.0f} s after the stop"
    records = read_metrics(run.metrics)
    (hang,) = events(records, "hang")
    assert hang.rank == 0 and hang.phase in ("step", "agreement") and hang.limit_s == 6.0
    (job,) = os.listdir(run.hangs)
    stacks = open(run.hang_stacks(job, 0)).read()
    assert "Current thread" in stacks or "Thread 0x" in stacks, stacks[:2000]
    (gone,) = events(records, "unresponsive")  # rank 1 never reported: it is named
    assert gone.ranks == [1] and gone.reported == 1 and run.read_bad_nodes() == gone.nodes
