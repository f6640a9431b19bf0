"""Training on one GPU: fp16 with dynamic loss scaling (CPU DeepSpeed has no fp16), from the
default scale and from one that must overflow; bf16 with the auto attention backend (flash-attn
when installed) and fused kernels under kernels.mode=auto. Each run is a subprocess so the
CUDA/ROCm context and DeepSpeed state stay isolated."""
import json
import subprocess
import sys

import pytest
import torch

from tests.support.paths import ROOT

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA or ROCm GPU; this machine has none")]


def _train(tmp_path, *overrides):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "megatron.cli.train", "--config", "examples/local/tiny.yaml",
           "--set", "training.train_iters=30", "--set", f"run.dir={run_dir}", *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_fp16_dynamic_loss_scaling(tmp_path):
    rows = _train(tmp_path, "--set", "training.precision=fp16")
    assert all(r["loss_scale"] and r["loss_scale"] > 0 for r in rows)
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.2


def test_fp16_loss_scale_backs_off_after_overflow(tmp_path):
    """Dynamic loss scaling at work: a start at 2**28 must overflow (a logit's gradient alone is
    about scale / (128 tokens x 8 accumulated micro-batches) = 2**18 > 65504, fp16's largest
    value), so the first steps are skipped and the scale halves (after DeepSpeed's hysteresis of
    2) until gradients fit; from then on steps apply and the loss falls. The scale never grows
    within the 1000-step window."""
    rows = _train(tmp_path, "--set", "training.precision=fp16", "--set",
                  "training.loss_scale.initial_power=28", "--set", "training.train_iters=40")
    scales = [r["loss_scale"] for r in rows]
    skipped = [r["skipped"] for r in rows]
    assert skipped[0], f"a 2**28 loss scale did not overflow on the first step: {rows[0]}"
    assert scales[0] <= 2 ** 28 and min(scales) < 2 ** 28, scales
    assert all(b <= a for a, b in zip(scales, scales[1:])), f"the scale grew: {scales}"
    assert False in skipped[:20], f"still overflowing after 20 steps: {skipped}, scales {scales}"
    # Once a scale fits, later overflows are rare (gradients shrink as the loss falls).
    first_applied = skipped.index(False)
    assert sum(skipped[first_applied:]) <= 3, f"skipped steps: {skipped}, scales {scales}"
    assert all(r["loss"] == r["loss"] for r in rows), "a NaN loss was logged"
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.3


def test_bf16_auto_backend_reports_mfu(tmp_path):
    rows = _train(tmp_path, "--set", "training.precision=bf16", "--set",
                  "model.attention_backend=auto", "--set", "kernels.mode=auto")
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.2
    name = torch.cuda.get_device_name(0).lower()
    known = any(k in name for k in ("mi250", "mi300", "a100", "h100", "h200"))
    assert (rows[-1]["mfu"] is not None) == known
    assert rows[-1]["mem_gb"] > 0
