"""A real full disk under metrics.jsonl: on a 64 KiB tmpfs the line that does not fit is one
InputError naming the file, and the lines before it read back whole. Mounting needs root or
CAP_SYS_ADMIN (CI's VM runs as root); skipped with the reason otherwise. The simulated full disk
is tests/unit/test_training_full_disk.py."""
import os
import subprocess

import pytest

from megatron.checkpoint.records import StepRecord, read_metrics
from megatron.checkpoint.rundir import RunDir
from megatron.config.errors import InputError
from megatron.training.metrics import MetricsWriter


def step(n):
    return StepRecord(step=n, loss=2.5, lr=1e-3, grad_norm=0.5, tokens_per_sec=100.0,
                      tflops_per_gpu=1.0, mfu=None, mem_gb=0.1, loss_scale=None, skipped=False,
                      step_time_s=0.2)

def test_a_real_full_disk_under_metrics_jsonl(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for a real full disk (needs root or CAP_SYS_ADMIN): "
                    f"{proc.stderr.strip()}")
    try:
        w = MetricsWriter(RunDir(str(mnt)), tensorboard=False)
        with pytest.raises(InputError, match="metrics.jsonl: no space left on device"):
            for n in range(1, 10000):
                w.write(step(n))
        w.close()
        steps = [r.step for r in read_metrics(w.path)]
        assert steps == list(range(1, len(steps) + 1)) and len(steps) > 100
    finally:
        subprocess.run(["umount", "--lazy", str(mnt)], check=True)  # even while a file is open
