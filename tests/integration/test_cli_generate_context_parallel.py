"""megatron-generate on a checkpoint trained with context parallelism (issue 23 item 3): a CP2
run on two ranks and a one-rank run of the same config (fp32, dropout off) train alike, and
greedy generation from each checkpoint gives the same tokens."""
import subprocess
import sys

import pytest

from tests.support.cli import clean_env, sets
from tests.support.paths import ROOT, TINY
from tests.support.procs import torchrun_cmd

pytestmark = pytest.mark.slow  # one torchrun launch, one process, two generations: about 40 s

TRAIN = ("training.train_iters=3", "training.save=true", "training.tensorboard=false",
         "model.hidden_dropout=0.0", "model.attention_dropout=0.0",
         "model.attention_backend=sdpa")


def _train(run_dir, nproc):
    head = [sys.executable, "-m", "megatron.cli.train"] if nproc == 1 else [
        *torchrun_cmd(nproc), "-m", "megatron.cli.train"]
    cp = [f"parallel.context_parallel_size={nproc}"]
    done = subprocess.run([*head, "--config", TINY, *sets(f"run.dir={run_dir}", *TRAIN, *cp)],
                          cwd=ROOT, env=clean_env(OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]


def _generate(run_dir):
    done = subprocess.run([sys.executable, "-m", "megatron.cli.generate", "--run-dir",
                           str(run_dir), "--tokens", "12", "--temperature", "0"], cwd=ROOT,
                          env=clean_env(OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_cp2_checkpoint_generates_what_the_one_rank_run_does(tmp_path):
    _train(tmp_path / "cp2", 2)
    _train(tmp_path / "one", 1)
    got, want = _generate(tmp_path / "cp2"), _generate(tmp_path / "one")
    assert got.strip() and got == want
