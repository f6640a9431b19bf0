"""Slow ranks are named (issue 20 item 5): with rank 1's forward passes made 60% slower, a
2-rank data-parallel run names rank 1, and only it, within 40 steps (the check runs every 10
steps, skips the first window's warm-up and names a rank slow in two windows in a row: at step 30
at the earliest, 40 when noise held one window under the factor); the same run without the delay
names none in 40 steps.

The ranks run on an emulated device (MEGATRON_TEST_DEVICE_GFLOPS, base/faults.py): every GEMM
also sleeps its time at 2.5 GFLOP/s, about 95 ms of each ~100 ms forward, so a forward's span is
mostly device time, as on a GPU, and the CPU's scheduling noise is a small part of it. Without
it, on the 2-core CPU two even ranks' median forwards differed by up to 15% from one window to
the next, and with three test processes on the cores rank 0's median once came out 1.4x the
60%-slowed rank 1's, two windows in a row, naming the wrong rank. Why 60% and not the issue's
30%: room for what noise remains. The decision itself (factor, two windows, the median of the
others) is tested exactly in
tests/unit/test_training_stragglers.py."""
import os
import subprocess

import pytest

from megatron.base.faults import DEVICE_GFLOPS_VAR
from megatron.base.records import events, read_metrics
from megatron.base.rundir import RunDir
from tests.support.cli import clean_env, sets
from tests.support.paths import ROOT, TINY
from tests.support.procs import torchrun_cmd

WORKER = os.path.join(ROOT, "tests", "support", "straggler_worker.py")


def _run(run: RunDir, **env):
    cmd = [*torchrun_cmd(2), WORKER, "--config", TINY, *sets(
               f"run.dir={run.path}", "training.train_iters=40", "training.tensorboard=false",
               # micro-batches of 8 sequences: ~235 MFLOP a forward, ~95 ms on the emulated
               # device beside ~8 ms of CPU
               "training.global_batch_size=32", "training.micro_batch_size=8",
               "training.straggler_interval=10")]
    proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(OMP_NUM_THREADS="1", **{
        DEVICE_GFLOPS_VAR: "2.5", **env}), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return events(read_metrics(run.metrics), "straggler")


@pytest.mark.slow
def test_a_rank_60_percent_slower_is_named_and_an_even_run_names_none(tmp_path):
    slow = _run(RunDir(str(tmp_path / "slow")), MEGATRON_TEST_SLOW_RANK="1",
                MEGATRON_TEST_SLOW_BY="0.6")
    assert slow and {e.rank for e in slow} == {1}, slow
    assert all(e.ratio > 1.2 for e in slow) and slow[0].step <= 40
    assert _run(RunDir(str(tmp_path / "even"))) == []
