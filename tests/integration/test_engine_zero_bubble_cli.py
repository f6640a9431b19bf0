"""parallel.pipeline_schedule reaches the engine through megatron-train (issue 24): PP2 on two
ranks with zbh1 logs the same per-step losses, bit for bit, as with 1f1b (fp32, dropout off),
and a zbh1 checkpoint continues under 1f1b; with PP=1 the key is refused by name. (Every step
of ZB-H1 against 1F1B, bit for bit, in more layouts: test_engine_zero_bubble.py of
tests/distributed.)"""
import subprocess

import pytest

from megatron.base.records import read_metrics, steps
from megatron.base.rundir import RunDir
from tests.support.cli import assert_clean_error, clean_env, run_cli, sets
from tests.support.paths import ROOT, TINY
from tests.support.procs import torchrun_cmd

pytestmark = pytest.mark.slow  # three torchrun launches of two ranks: about 60 s


def _losses(run_dir, schedule, *extra):
    cmd = [*torchrun_cmd(2), "-m", "megatron.cli.train", "--config", TINY,
           *sets(f"run.dir={run_dir}", "training.train_iters=4", "training.tensorboard=false",
                 "parallel.pipeline_parallel_size=2", f"parallel.pipeline_schedule={schedule}",
                 "model.hidden_dropout=0.0", "model.attention_dropout=0.0", *extra)]
    done = subprocess.run(cmd, cwd=ROOT, env=clean_env(OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return {r.step: r.loss for r in steps(read_metrics(RunDir(str(run_dir)).metrics))}


def test_zbh1_trains_the_same_losses_as_1f1b_and_its_checkpoints_continue_under_1f1b(tmp_path):
    """Two zbh1 steps give the 1f1b run's losses, bit for bit; saved, their checkpoint continues
    under 1f1b with the uninterrupted run's losses (a checkpoint does not depend on the
    schedule)."""
    one_f_one_b = _losses(tmp_path / "1f1b", "1f1b")
    assert sorted(one_f_one_b) == [1, 2, 3, 4]
    mixed = tmp_path / "mixed"
    zero_bubble = _losses(mixed, "zbh1", "training.exit_interval=2")
    assert zero_bubble == {step: one_f_one_b[step] for step in (1, 2)}
    both = _losses(mixed, "1f1b", "training.load=auto")
    assert both == one_f_one_b


def test_zbh1_without_a_pipeline_is_refused(tmp_path):
    proc = run_cli(["--config", TINY, *sets(f"run.dir={tmp_path}/r",
                                            "parallel.pipeline_schedule=zbh1")],
                   clean_env())
    assert_clean_error(proc, "parallel.pipeline_schedule")
