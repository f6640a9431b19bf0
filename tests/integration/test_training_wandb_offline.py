"""run.wandb=offline through megatron-train: the offline run folder under <run.dir>/wandb holds,
read back from its .wandb file, the same values as metrics.jsonl (every step's loss, lr, grad
norm, tokens/s; the evaluations; the save events), with the run's name, project and tags; and
the log shows one line per step (step/total, elapsed, ETA, tok/s, TFLOP/s, MFU, loss, lr, grad
norm, memory) and one per event. Without the wandb package the run goes on and one line says
how to install it."""
import os
import subprocess
import sys

import pytest

from tests.support.cli import clean_env, sets, train_cmd
from tests.support.paths import ROOT, TINY
from megatron.base.records import EvalRecord, SaveEvent, StepRecord, read_metrics
from megatron.base.rundir import RunDir

pytest.importorskip("wandb", reason="installed by `make setup` (the dev extra)")


def _train(run_dir, *extra, prefix=()):
    args = ["--config", TINY, *sets(f"run.dir={run_dir}", "training.train_iters=6",
                                    "training.eval_interval=3", "training.save=true",
                                    "training.save_interval=3", *extra)]
    env = clean_env(WANDB_SILENT="true", WANDB_DISABLE_GIT="true")
    cmd = list(prefix) + args if prefix else train_cmd(*args)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.mark.slow
def test_offline_run_holds_what_metrics_jsonl_holds(tmp_path):
    from tests.support.wandb_files import history, run_info

    run_dir = tmp_path / "run"
    proc = _train(run_dir, "run.wandb=offline", "run.wandb_name=tiny-offline",
                  "run.wandb_tags=[ci, tiny]")
    logged = history(str(run_dir))
    records = read_metrics(RunDir(str(run_dir)).metrics)
    steps = [r for r in records if isinstance(r, StepRecord)]
    assert [r.step for r in steps] == list(range(1, 7))
    by_step = {h["step"]: h for h in logged if "train/loss" in h}
    for r in steps:
        h = by_step[r.step]
        for key in ("loss", "lr", "grad_norm", "tokens_per_sec", "tflops_per_gpu", "mem_gb"):
            assert h[f"train/{key}"] == pytest.approx(getattr(r, key), rel=1e-12), (r.step, key)
    evals = [(r.step, r.split, r.loss) for r in records if isinstance(r, EvalRecord)]
    got = [(h["step"], split, h[f"{split}/loss"]) for h in logged for split in ("valid", "test")
           if f"{split}/loss" in h]
    assert got == evals and [e[0] for e in evals if e[1] == "valid"] == [3, 6]
    saves = [(r.step, r.gb) for r in records if isinstance(r, SaveEvent)]
    assert [(h["step"], h["event/save/gb"]) for h in logged if "event/save" in h] == saves
    assert saves, "the run saved nothing"
    assert run_info(str(run_dir)) == {"name": "tiny-offline", "project": "megatron-frontier",
                                      "group": "tiny-offline", "tags": ["ci", "tiny"]}
    lines = proc.stderr
    assert "step 6/6 (100%)" in lines and "ETA" in lines and "tok/s" in lines, lines[-3000:]
    assert "TFLOP/s/GPU" in lines and "MFU" in lines and "grad norm" in lines, lines[-3000:]
    assert "save: step 3" in lines and "evaluation: step 3, validation loss" in lines


@pytest.mark.slow
def test_missing_wandb_is_one_message(tmp_path):
    """The package hidden (an import hook that refuses it), as on a machine without it."""
    hide = ("import sys, runpy; sys.modules['wandb'] = None; sys.argv = ['megatron-train'] + "
            "sys.argv[1:]; runpy.run_module('megatron.cli.train', run_name='__main__')")
    proc = _train(tmp_path / "run", "run.wandb=offline", "training.save=false",
                  "training.eval_interval=0", prefix=[sys.executable, "-c", hide])
    assert proc.stderr.count("pip install wandb") == 1, proc.stderr[-3000:]
    assert not os.path.exists(tmp_path / "run" / "wandb")
