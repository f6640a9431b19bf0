"""A stopped rank of a 4-rank run, at a seeded point (issue 20, "hangs end fast and say where"):
the test hook MEGATRON_TEST_STOP_AT makes rank 2 SIGSTOP itself, first in the step phase of step
7, in the next job in the save of step 10 (the others write their shards and wait for it). Each
time the three others end within the steady limit plus 60 s, each leaves its stacks in
hangs/<job>/, the first names rank 2 as unresponsive (and its node in bad_nodes), and the next
job resumes from the last committed checkpoint; the three jobs together give an uninterrupted
run's losses."""
import os
import subprocess
import time

import pytest

from megatron.base.records import events, read_metrics, steps
from megatron.base.rundir import RunDir
from tests.support.cli import clean_env, sets
from tests.support.paths import ROOT, TINY
from tests.support.procs import torchrun_cmd

pytestmark = pytest.mark.slow  # four torchrun launches of four ranks: about 3 minutes

LIMIT_S = 6.0  # training.hang_timeout_minutes=0.1
TRAIN = ("training.train_iters=12", "training.save_interval=2", "training.tensorboard=false",
         "training.global_batch_size=8", "model.num_layers=2",
         f"training.hang_timeout_minutes={LIMIT_S / 60}")


def _torchrun(run_dir, stop_at=None, timeout=240):
    env = clean_env(OMP_NUM_THREADS="1")
    if stop_at:
        env["MEGATRON_TEST_STOP_AT"] = stop_at
    cmd = [*torchrun_cmd(4), "-m", "megatron.cli.train", "--config", TINY,
           *sets(f"run.dir={run_dir}", "training.load=auto", *TRAIN)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    return proc, time.monotonic() - t0


def _last_losses(run: RunDir):
    """Each step's loss as last written (a resumed job rewrites the steps after its checkpoint)."""
    return {r.step: r.loss for r in steps(read_metrics(run.metrics))}


def _hung_job(run: RunDir, job_index: int):
    jobs = sorted(os.listdir(run.hangs))
    assert len(jobs) == job_index + 1, jobs
    folder = os.path.join(run.hangs, jobs[job_index])
    return folder, sorted(os.listdir(folder))


def test_a_stopped_rank_ends_the_job_names_itself_and_the_next_job_resumes_exactly(tmp_path):
    ref, run = RunDir(str(tmp_path / "ref")), RunDir(str(tmp_path / "run"))
    done, _ = _torchrun(ref.path)
    assert done.returncode == 0, done.stderr[-3000:]
    want = _last_losses(ref)
    assert sorted(want) == list(range(1, 13))

    # Job 1: rank 2 stops in step 7; checkpoints 2, 4, 6 are committed.
    first, took = _torchrun(run.path, stop_at="2:7:step")
    assert first.returncode != 0, first.stderr[-3000:]
    assert took < 90 + LIMIT_S + 60, f"job 1 took {took:.0f} s"  # start-up, 7 steps, the hang
    folder, files = _hung_job(run, 0)
    assert files == ["rank00000.txt", "rank00001.txt", "rank00003.txt", "unresponsive.txt"]
    for name in files[:3]:
        stacks = open(os.path.join(folder, name)).read()
        assert "of step 7 ran" in stacks and "Thread 0x" in stacks, stacks[:1500]
    records = read_metrics(run.metrics)
    hangs = events(records, "hang")
    assert sorted(h.rank for h in hangs) == [0, 1, 3] and {h.step for h in hangs} == {7}
    (gone,) = events(records, "unresponsive")
    assert gone.ranks == [2] and gone.step == 7 and gone.reported == 3
    assert run.read_bad_nodes() == gone.nodes
    assert "never reported" in first.stderr and "rank(s) 2 (" in first.stderr
    assert max(r.step for r in steps(records)) == 6

    # Job 2 resumes from step 6; rank 2 stops entering the save of step 10: the others have
    # written their shards of it and wait; checkpoint 10 stays invisible.
    second, _ = _torchrun(run.path, stop_at="2:10:save")
    assert second.returncode != 0, second.stderr[-3000:]
    folder, files = _hung_job(run, 1)
    assert "unresponsive.txt" in files and "rank00002.txt" not in files
    assert "save of step 10 ran" in open(os.path.join(folder, "rank00000.txt")).read()
    found = run.continuation().found
    assert found is not None and found.step == 8, run.continuation()

    # Job 3 resumes from step 8 and finishes: the three jobs' losses are the uninterrupted run's.
    third, _ = _torchrun(run.path)
    assert third.returncode == 0, third.stderr[-3000:]
    got = _last_losses(run)
    assert sorted(got) == list(range(1, 13))
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-6), (step, got, want)
