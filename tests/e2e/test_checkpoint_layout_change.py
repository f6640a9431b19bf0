"""Moving a run to another layout through the real CLI: training.load=auto continues a TP2
checkpoint as TP1 (the whole state; tests/distributed/test_checkpoint_layouts.py holds the losses
to 1e-5), and a single-file model (megatron-convert to-single, then training.init_from) starts
any layout from the same weights."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from megatron.cli.convert import main as convert_main
from tests.e2e.e2e_helpers import ROOT, TINY, RunEnv, set_args
from megatron.base.records import read_metrics, steps
from megatron.base.rundir import RunDir
from tests.support.procs import torchrun_cmd

pytestmark = pytest.mark.slow
EXE = shutil.which("megatron-train") or os.path.join(os.path.dirname(sys.executable),
                                                     "megatron-train")
# vocab 500 pads to 512 rows at TP1 and TP2 alike; 4 layers split over PP2.
BASE = ("model.vocab_size=500", "training.log_interval=1")


_ENVS = {}


def _env(tmp_path):
    """One RunEnv (compiler stubs, empty TORCH_EXTENSIONS_DIR) per test, shared by its launches."""
    if str(tmp_path) not in _ENVS:
        home = tmp_path / "launch_env"
        home.mkdir()
        _ENVS[str(tmp_path)] = RunEnv(home).env
    return _ENVS[str(tmp_path)]


def train(tmp_path, nproc, run_dir, *items):
    """megatron-train on nproc CPU ranks (plain for one, torchrun for more)."""
    cmd = [EXE] if nproc == 1 else [*torchrun_cmd(nproc), EXE]
    cmd += ["--config", TINY, *set_args(*BASE, f"run.dir={run_dir}", *items)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=_env(tmp_path))


def losses(run_dir):
    return [r.loss for r in steps(read_metrics(RunDir(str(run_dir)).metrics))]


def test_resume_continues_in_another_layout_and_init_from_starts_any(tmp_path):
    a = tmp_path / "tp2"
    proc = train(tmp_path, 2, a, "parallel.tensor_parallel_size=2", "training.train_iters=4",
                 "training.save=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((a / "checkpoints" / "step_0000004" / "meta.json").read_text())
    assert (meta["layout"]["tensor_parallel_size"], meta["layout"]["data_parallel_size"]) == (2, 1)

    # Same run directory, TP1 on one process: continues from step 4 with its optimizer.
    proc = train(tmp_path, 1, a, "training.train_iters=6", "training.load=auto",
                 "training.save=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "at step 4" in proc.stderr
    assert "written by TP2 PP1 DP1 ZeRO-1, continued as TP1 PP1 DP1 ZeRO-1" in proc.stderr
    assert os.path.isdir(a / "checkpoints" / "step_0000006")

    model = tmp_path / "model.pt"
    assert convert_main(["to-single", "--run-dir", str(a), "--output", str(model)]) == 0
    single, piped = tmp_path / "tp1", tmp_path / "pp2"
    proc = train(tmp_path, 1, single, "training.train_iters=2", f"training.init_from={model}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "initialised" in proc.stderr and "from " + str(model) in proc.stderr
    proc = train(tmp_path, 2, piped, "parallel.pipeline_parallel_size=2",
                 "training.train_iters=2", f"training.init_from={model}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    zero3 = tmp_path / "dp2z3"  # the weights go in before ZeRO-3 partitions them
    proc = train(tmp_path, 2, zero3, "parallel.zero_stage=3", "training.train_iters=2",
                 f"training.init_from={model}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    fresh, tp1 = losses(a)[0], losses(single)[0]
    # Every layout starts from the trained weights (the same batch sees a lower loss than the
    # fresh model did) and from the same ones (equal to float rounding).
    assert tp1 < fresh - 0.05, (tp1, fresh)
    for other in (piped, zero3):
        assert abs(losses(other)[0] - tp1) <= 1e-5 * tp1, (other.name, losses(other)[0], tp1)


def test_init_from_must_exist_and_fit(tmp_path):
    proc = train(tmp_path, 1, tmp_path / "x", "training.train_iters=1",
                 f"training.init_from={tmp_path / 'missing.pt'}")
    assert proc.returncode == 2
    assert "checkpoint.init_from=" in proc.stderr and "an existing single-file model" in proc.stderr
