"""training.async_save through megatron-train, on real processes and disks.

- Two ranks (DP2 ZeRO-1) save at steps 4 and 8 and at the end, synchronously and in the
  background (asynchronous, through the node-local tier, both): every shard and index.json are
  byte-identical, the losses are equal, and a resume from the background save of step 8 gives
  the uninterrupted run's losses.
- An error injected into rank 1's writer at step 8 ends the run non-zero within 60 s, every error
  line naming rank 1 and the cause; the run resumes from step 4 with the uninterrupted losses.
- The disk filling during a background write (run.dir on a 4 MiB tmpfs: the first checkpoint
  fits, the second does not) is one error line naming the shard, 'no space left on device' and
  the bytes needed; the step-4 checkpoint resumes elsewhere with the uninterrupted losses.
A failure names the case; the in-process byte identity is tests/unit/test_checkpoint_async_save.py."""
import filecmp
import os
import shutil
import subprocess
import time

import pytest

from megatron.checkpoint import sharded
from megatron.base.records import events, read_metrics, steps
from tests.support.cli import clean_env, run_cli, sets, train_cmd
from tests.support.disks import tmpfs
from tests.support.paths import ROOT, TINY
from tests.support.procs import torchrun_cmd

pytestmark = pytest.mark.slow
COMMON = ("training.train_iters=10", "training.save_interval=4", "training.save=true",
          "training.tensorboard=false", "training.log_interval=1")


def launch(run_dir, *items, nproc=2, env=None, timeout=120):
    cmd = train_cmd("--config", TINY, *sets(f"run.dir={run_dir}", *COMMON, *items))
    if nproc > 1:
        cmd = [*torchrun_cmd(nproc), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env=clean_env(OMP_NUM_THREADS="1", **(env or {})))


def losses(run_dir):
    return {r.step: r.loss for r in steps(read_metrics(os.path.join(run_dir, "metrics.jsonl")))}


def ckpt(run_dir, step):
    return os.path.join(run_dir, "checkpoints", f"step_{step:07d}")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run = str(tmp_path_factory.mktemp("sync") / "run")
    proc = launch(run)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run


@pytest.mark.parametrize("mode", ["async", "local", "async+local"])
def test_background_saves_are_byte_identical_and_resume_exactly(uninterrupted, tmp_path, mode):
    """async: training.async_save; local: synchronous to training.save_local_dir, drained in
    the background; both together."""
    run = str(tmp_path / "async")
    items = {"async": ["training.async_save=true"],
             "local": [f"training.save_local_dir={tmp_path / 'nvme'}"]}
    items["async+local"] = items["async"] + items["local"]
    proc = launch(run, *items[mode])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert losses(run) == losses(uninterrupted)
    for step in (4, 8, 10):
        names = ["index.json"] + sorted(
            os.path.join("shards", n) for n in os.listdir(os.path.join(ckpt(run, step),
                                                                       "shards")))
        assert len(names) == 3, names
        same, differ, missing = filecmp.cmpfiles(ckpt(uninterrupted, step), ckpt(run, step),
                                                 names, shallow=False)
        assert (differ, missing) == ([], []), f"step {step}: {differ} {missing} differ"
    saves = events(read_metrics(os.path.join(run, "metrics.jsonl")), "save")
    assert [s.step for s in saves] == [4, 8, 10]
    assert all(s.blocking_s is not None and s.background_s > 0 for s in saves), saves
    resumed = str(tmp_path / "resumed")
    shutil.copytree(ckpt(run, 8), ckpt(resumed, 8))
    proc = launch(resumed, "training.load=auto", *items[mode])
    assert proc.returncode == 0, proc.stderr[-4000:]
    got, want = losses(resumed), losses(uninterrupted)
    assert [got[s] for s in (9, 10)] == [want[s] for s in (9, 10)]


def test_a_failing_writer_ends_the_run_naming_its_rank_and_the_previous_checkpoint_resumes(
        uninterrupted, tmp_path):
    run = str(tmp_path / "failing")
    t0 = time.monotonic()
    proc = launch(run, "training.async_save=true", env={sharded.FAIL_WRITER_VAR: "1:8"})
    took = time.monotonic() - t0
    assert proc.returncode != 0 and took < 60, (proc.returncode, took, proc.stderr[-3000:])
    errors = [line for line in proc.stderr.splitlines() if "megatron-train: error:" in line]
    assert errors and len(set(errors)) == 1, proc.stderr[-4000:]
    assert "step_0000008 was not committed: rank 1: an error injected into the writer" \
        in errors[0], errors[0]
    assert sorted(n for n in os.listdir(os.path.join(run, "checkpoints"))
                  if n.startswith("step_")) == ["step_0000004"]
    proc = launch(run, "training.async_save=true", "training.load=auto")
    assert proc.returncode == 0, proc.stderr[-4000:]
    got, want = losses(run), losses(uninterrupted)
    assert [got[s] for s in range(5, 11)] == [want[s] for s in range(5, 11)]


def test_a_disk_that_fills_during_a_background_write_is_one_message(uninterrupted, tmp_path):
    with tmpfs(tmp_path / "disk", "4m") as disk:
        run = str(disk / "run")
        proc = run_cli(["--config", TINY, *sets(f"run.dir={run}", *COMMON,
                                                "training.async_save=true")],
                       clean_env(OMP_NUM_THREADS="1"))
        assert proc.returncode == 2, proc.stderr[-4000:]
        errors = [line for line in proc.stderr.splitlines() if "error:" in line]
        assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-4000:]
        for part in ("step_0000008 was not committed: rank 0: ", "no space left on device",
                     "shards/tp00_pp000_dp00000.pt", "needs at least", "bytes free"):
            assert part in errors[0], errors[0]
        kept = str(tmp_path / "kept")
        shutil.copytree(ckpt(run, 4), ckpt(kept, 4))
    proc = launch(kept, "training.load=auto", nproc=1)
    assert proc.returncode == 0, proc.stderr[-4000:]
    single = str(tmp_path / "single")
    assert launch(single, nproc=1).returncode == 0
    got, want = losses(kept), losses(single)
    assert [got[s] for s in range(5, 11)] == [want[s] for s in range(5, 11)]
