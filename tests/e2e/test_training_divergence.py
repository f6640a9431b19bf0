"""The run guards itself, through the real CLI: a diverged run (optimizer.lr=1e6: the loss is NaN
from step 2) stops with exit code 3 and one message naming the last good checkpoint, and commits
nothing after it; a loss spike with loss_spike_action=rollback reloads the newest checkpoint and
goes on past the batches that caused it, and still ends at train_iters."""
import json
import os
import subprocess
import sys

import pytest

from megatron.base import store
from tests.e2e.e2e_helpers import ROOT, TINY, RunEnv, set_args

pytestmark = pytest.mark.slow
EXE = os.path.join(os.path.dirname(sys.executable), "megatron-train")


def _train(tmp_path, run_dir, *items):
    env = RunEnv(tmp_path / f"env-{run_dir.name}")
    return subprocess.run([EXE, "--config", TINY, *set_args(
        f"run.dir={run_dir}", "training.tensorboard=false", *items)],
        cwd=ROOT, env=env.env, capture_output=True, text=True, timeout=300)


def _lines(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_diverged_run_stops_and_commits_nothing_after_its_last_good_state(tmp_path):
    run_dir = tmp_path / "run"
    (tmp_path / f"env-{run_dir.name}").mkdir()
    proc = _train(tmp_path, run_dir, "optimizer.lr=1e6", "training.train_iters=10",
                  "training.save_interval=1")
    assert proc.returncode == 3, proc.stderr[-3000:]
    good = run_dir / "checkpoints" / "step_0000001"
    assert f"the last good checkpoint is {good}" in proc.stderr
    assert "step 2: the loss is nan" in proc.stderr and "Traceback" not in proc.stderr
    assert [os.path.basename(f) for _, f in store.committed(str(run_dir / "checkpoints"))] \
        == ["step_0000001"]
    events = [r for r in _lines(run_dir) if r.get("event") == "diverged"]
    assert events == [{"event": "diverged", "step": 2, "reason": "step 2: the loss is nan"}]


def test_a_spike_rolls_back_and_skips_the_batches_that_caused_it(tmp_path):
    """lr 0.02 makes the tiny model's loss jump by a few percent now and then (measured: three
    spikes above 1.03 x the median of the last 5 losses in 30 steps). Whatever their number on
    this CPU, each rollback returns to the newest checkpoint, and the data stream never rewinds:
    the samples consumed at the end count every step run, rolled back or not."""
    run_dir = tmp_path / "run"
    (tmp_path / f"env-{run_dir.name}").mkdir()
    proc = _train(tmp_path, run_dir, "optimizer.lr=0.02", "training.train_iters=30",
                  "training.save_interval=3", "training.loss_spike_factor=1.03",
                  "training.loss_spike_window=5", "training.loss_spike_action=rollback",
                  "training.max_rollbacks=20", "model.hidden_dropout=0.0",
                  "model.attention_dropout=0.0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = _lines(run_dir)
    saved, rollbacks, steps_run = [], [], 0
    for r in lines:
        if r.get("event") == "save":
            saved.append(r["step"])
        elif r.get("event") == "rollback":
            rollbacks.append(r)
            assert r["to_step"] == saved[-1], (r, saved)  # the newest checkpoint
        elif "loss" in r and "split" not in r:
            steps_run += 1
    assert rollbacks, "no spike was rolled back"
    meta = json.loads((run_dir / "checkpoints" / "step_0000030" / "meta.json").read_text())
    assert meta["step"] == 30
    assert meta["consumed_samples"] == steps_run * 16  # global batch 16: no batch read twice
    assert steps_run == 30 + sum(r["step"] - r["to_step"] for r in rollbacks)
