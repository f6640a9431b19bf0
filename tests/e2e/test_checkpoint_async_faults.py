"""A rank killed (kill -9) while its background checkpoint is in flight, under torchrun on two
CPU ranks (DP2 ZeRO-1): with training.async_save alone, while rank 1's writer holds the save of
step 8; with the node-local tier (training.save_local_dir), after its local file is written
and before its drain into run.dir. MEGATRON_TEST_SLOW_WRITER holds each write and drain back
3 s so the kill lands inside that window every time. The job ends non-zero, step 8 is never
committed, and the resume continues from step 4 with the uninterrupted run's losses. The same
layout's byte identity and an injected writer failure are tests/integration/
test_training_async_save.py."""
import os
import signal
import subprocess
import time

import pytest

from megatron.checkpoint import sharded
from megatron.base.records import read_metrics, steps
from tests.support.cli import clean_env, sets, train_cmd
from tests.support.paths import ROOT, TINY
from tests.support.procs import pid_of, torchrun_cmd

pytestmark = pytest.mark.slow
COMMON = ("training.train_iters=10", "training.save_interval=4", "training.tensorboard=false",
          "training.log_interval=1")


def command(run_dir, *items):
    return [*torchrun_cmd(2),
            *train_cmd("--config", TINY, *sets(f"run.dir={run_dir}", *COMMON, *items))]


def run(run_dir, *items):
    proc = subprocess.run(command(run_dir, *items), capture_output=True, text=True, cwd=ROOT,
                          timeout=180, env=clean_env(OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]


def losses(run_dir):
    return {r.step: r.loss for r in steps(read_metrics(os.path.join(run_dir, "metrics.jsonl")))}


def committed(run_dir):
    return sorted(n for n in os.listdir(os.path.join(run_dir, "checkpoints"))
                  if n.startswith("step_"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("ref") / "run")
    run(run_dir)
    return losses(run_dir)


def kill_rank1_while_step8_is_in_flight(run_dir, *items):
    env = clean_env(OMP_NUM_THREADS="1", **{sharded.SLOW_WRITER_VAR: "3"})
    job = subprocess.Popen(command(run_dir, "training.async_save=true", *items), cwd=ROOT,
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    staging = os.path.join(run_dir, "checkpoints", ".staging-step_0000008")
    deadline = time.monotonic() + 120
    while not os.path.isdir(staging) and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.isdir(staging), "the save of step 8 never started"
    time.sleep(1.0)  # inside the writer's 3 s hold
    pid = pid_of("megatron-train", run_dir, env_has="RANK=1")  # this run's rank, no other test's
    assert pid is not None, "rank 1 not found"
    os.kill(pid, signal.SIGKILL)
    _, err = job.communicate(timeout=120)
    assert job.returncode != 0, err[-3000:]
    assert committed(run_dir) == ["step_0000004"], committed(run_dir)


@pytest.mark.parametrize("tier", ["direct", "local"])
def test_a_rank_killed_during_a_background_save_resumes_from_the_previous_checkpoint(
        uninterrupted, tmp_path, tier):
    run_dir = str(tmp_path / "run")
    local = (f"training.save_local_dir={tmp_path / 'nvme'}",) if tier == "local" else ()
    kill_rank1_while_step8_is_in_flight(run_dir, *local)
    run(run_dir, "training.async_save=true", "training.load=auto", *local)
    got = losses(run_dir)
    assert [got[s] for s in range(5, 11)] == [uninterrupted[s] for s in range(5, 11)]
