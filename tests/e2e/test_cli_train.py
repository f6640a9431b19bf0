"""The issue's command line: torchrun with 4 ranks, TP=2 x PP=2, through the console entry point,
writes the run directory contract (config.yaml, deepspeed.json, metrics.jsonl keys, TensorBoard)."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.procs import torchrun_cmd

KEYS = {"step", "loss", "lr", "grad_norm", "tokens_per_sec", "tflops_per_gpu", "mfu", "mem_gb",
        "loss_scale", "skipped"}

pytestmark = pytest.mark.slow


def test_torchrun_tp2_pp2_writes_run_directory(tmp_path):
    exe = shutil.which("megatron-train") or os.path.join(os.path.dirname(sys.executable),
                                                         "megatron-train")
    run_dir = tmp_path / "run"
    cmd = [*torchrun_cmd(4), exe, "--config", "examples/local/tiny.yaml",
           "--set", "parallel.tensor_parallel_size=2", "--set", "parallel.pipeline_parallel_size=2",
           "--set", "training.train_iters=3", "--set", "training.eval_interval=3",
           "--set", f"run.dir={run_dir}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if r.get("split") != "valid"]
    valid = [r for r in lines if r.get("split") == "valid"]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert KEYS <= set(train[0]), KEYS - set(train[0])
    assert train[0]["mfu"] is None  # no peak is known for a CPU
    assert all(r["tflops_per_gpu"] > 0 and r["tokens_per_sec"] > 0 for r in train)
    assert len(valid) == 1 and valid[0]["step"] == 3
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["parallel"]["tensor_parallel_size"] == 2
    ds = json.loads((run_dir / "deepspeed.json").read_text())
    assert ds["train_batch_size"] == 16 and ds["gradient_accumulation_steps"] == 8
    assert ds["pipeline"]["activation_checkpoint_interval"] == 0
    assert any((run_dir / "tensorboard").iterdir())


def test_real_data_run_evaluates_valid_and_test_splits(tmp_path):
    """Pre-tokenized MMIDIDX data with the null tokenizer: validation during training, the test
    split once at the end, each logged with its split."""
    import numpy as np
    from tests.support.data import write_tokens
    rng = np.random.default_rng(0)
    prefix = str(tmp_path / "corpus")
    write_tokens(prefix, [rng.integers(0, 511, size=int(rng.integers(20, 200))).tolist()
                          for _ in range(60)])
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "megatron.cli.train", "--config", "examples/local/tiny.yaml",
           "--set", "data.synthetic=false", "--set", f"data.paths=[{prefix}]",
           "--set", "data.split=80,10,10", "--set", f"data.cache_dir={tmp_path / 'cache'}",
           "--set", "training.train_iters=2", "--set", "training.eval_interval=2",
           "--set", "training.tensorboard=false", "--set", f"run.dir={run_dir}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    splits = [(r.get("split", "train"), r["step"]) for r in lines]
    assert splits == [("train", 1), ("train", 2), ("valid", 2), ("test", 2)], splits
    assert all(np.isfinite(r["loss"]) for r in lines)
