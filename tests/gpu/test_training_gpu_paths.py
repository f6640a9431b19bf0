"""Code paths that only a GPU takes, none of which has run on one yet (issue 27):

- training.async_save's snapshot: device tensors copied into pinned host buffers on a side
  stream. A background save of CUDA state is byte for byte the synchronous save of it, even when
  the next update overwrites the state as soon as the copy is reported done; and a one-GPU run
  with async saves resumes from its step-8 checkpoint on the losses it logged.
- the straggler check's timer: forward spans as CUDA events, read once per window at take():
  nothing synchronises before, and a span is what the device took against a synchronised wall
  clock.

Training runs are subprocesses, as in test_training_gpu.py."""
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

from megatron.base.records import events, read_metrics, steps
from megatron.engine.engine import ComputeTimer
from tests.support.paths import ROOT
from tests.support.async_saves import check_background_saves, flat_state

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA or ROCm GPU; this machine has none")]


def test_a_background_save_of_cuda_state_is_the_synchronous_one(tmp_path, one_rank_group):
    rs, flats = flat_state(device="cuda")
    assert all(f.is_cuda for f in flats)
    check_background_saves(tmp_path, rs, flats)


def _train(run_dir, *items):
    cmd = [sys.executable, "-m", "megatron.cli.train", "--config", "examples/local/tiny.yaml"]
    for item in (f"run.dir={run_dir}", "training.train_iters=10", "training.save_interval=4",
                 "training.save=true", "training.tensorboard=false", "training.log_interval=1",
                 "training.precision=bf16", "training.async_save=true", *items):
        cmd += ["--set", item]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    return {r.step: r.loss for r in steps(rows)}, events(rows, "save")


def test_a_gpu_run_with_async_saves_resumes_on_its_losses(tmp_path):
    run = str(tmp_path / "run")
    losses, saves = _train(run)
    assert [s.step for s in saves] == [4, 8, 10]
    assert all(s.background_s > 0 for s in saves), saves
    resumed = str(tmp_path / "resumed")
    shutil.copytree(os.path.join(run, "checkpoints", "step_0000008"),
                    os.path.join(resumed, "checkpoints", "step_0000008"))
    cont, _ = _train(resumed, "training.load=auto")
    for step in (9, 10):
        assert cont[step] == pytest.approx(losses[step], rel=1e-3), (step, cont, losses)


def test_the_straggler_timer_times_forward_spans_with_cuda_events():
    timer = ComputeTimer(torch.device("cuda"))
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    walls = []
    for _ in range(5):
        t0 = time.perf_counter()
        timer.start()
        for _ in range(20):
            a = a @ a
            a = a / a.norm()
        timer.stop()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    assert len(timer.pending) == 5 and not timer.spans  # nothing read before take()
    span = timer.take()
    walls.sort()
    assert 0 < span <= walls[-1] * 1.05, (span, walls)
    assert span >= 0.5 * walls[len(walls) // 2], (span, walls)
    assert timer.take() == 0.0  # a new window


def test_a_model_built_under_the_gpu_context_is_the_cpu_built_one():
    """`with torch.device("cuda"):` around the model build: the seeded weights are drawn on the
    CPU and moved, so the model equals the CPU-built one moved to the GPU, MoE layers included."""
    from megatron.config import load_config
    from megatron.model import build_model
    from megatron.parallel.state import ParallelState
    cfg = load_config(os.path.join(ROOT, "examples", "local", "tiny.yaml"),
                      ["model.moe.num_experts=4", "model.moe.top_k=2"])
    cpu = build_model(cfg, ParallelState.single(), 512)
    with torch.device("cuda"):
        gpu = build_model(cfg, ParallelState.single(), 512)
    theirs = dict(gpu.named_parameters())
    for name, p in cpu.named_parameters():
        assert theirs[name].is_cuda, name
        assert torch.equal(theirs[name].cpu(), p.detach()), name
