"""Slow ranks are named (issue 20 item 5): with rank 1's forward passes made 30% slower, a
2-rank data-parallel run names rank 1, and only it, by step 30 (the check runs every 10 steps and
skips the first window's warm-up); the same run without the delay names none."""
import os
import subprocess
import sys

import pytest

from megatron.checkpoint.records import events, read_metrics
from megatron.checkpoint.rundir import RunDir
from tests.support.cli import clean_env, sets
from tests.support.paths import ROOT, TINY

WORKER = os.path.join(ROOT, "tests", "support", "straggler_worker.py")


def _run(run: RunDir, **env):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           WORKER, "--config", TINY, *sets(
               f"run.dir={run.path}", "training.train_iters=30", "training.tensorboard=false",
               "training.global_batch_size=8", "training.micro_batch_size=2",
               "training.straggler_interval=10")]
    proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(OMP_NUM_THREADS="1", **env),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return events(read_metrics(run.metrics), "straggler")


@pytest.mark.slow
def test_a_rank_30_percent_slower_is_named_and_an_even_run_names_none(tmp_path):
    slow = _run(RunDir(str(tmp_path / "slow")), MEGATRON_TEST_SLOW_RANK="1",
                MEGATRON_TEST_SLOW_BY="0.3")
    assert slow and {e.rank for e in slow} == {1}, slow
    assert all(e.ratio > 1.2 for e in slow) and slow[0].step <= 30
    assert _run(RunDir(str(tmp_path / "even"))) == []
