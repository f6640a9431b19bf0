"""A checkpoint written before the run directory got its owner and the checkpoint meta record
its type (main at 44fc5fd, 2026-12-01: two ranks, TP2, ZeRO-1, steps 1-4) still continues: one
process at TP1 resumes it and trains steps 5-8 with the losses, learning rates and gradient norms
that main itself produced from the same checkpoint (tests/support/data/checkpoint_v1_tp2).

A failure here means the on-disk format or its reading changed: old runs would not continue."""
import json
import os
import shutil

import pytest

from tests.support.cli import clean_env, run_cli, sets
from tests.support.paths import ROOT
from megatron.base.records import read_metrics, steps

FIXTURE = os.path.join(ROOT, "tests", "support", "data", "checkpoint_v1_tp2")


@pytest.fixture
def old_run(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    return run


def _step_lines(path):
    return {r.step: r for r in steps(read_metrics(str(path)))}


def test_a_checkpoint_of_the_previous_format_continues_with_the_same_losses(old_run):
    expected = json.load(open(os.path.join(FIXTURE, "continuation.json")))["steps"]
    proc = run_cli(["--config", str(old_run / "config.yaml"), *sets(
        f"run.dir={old_run}", "training.load=auto", "parallel.tensor_parallel_size=1",
        "training.exit_interval=0", "training.tensorboard=false")], clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stderr and "step_0000004" in proc.stderr, proc.stderr[-3000:]
    got = _step_lines(old_run / "metrics.jsonl")
    assert sorted(got) == [5, 6, 7, 8], sorted(got)
    for step, want in expected.items():
        line = got[int(step)]
        for key in ("loss", "lr", "grad_norm"):
            assert getattr(line, key) == pytest.approx(want[key], rel=1e-5, abs=1e-7), (step, key)
