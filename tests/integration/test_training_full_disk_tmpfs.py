"""A real full disk under metrics.jsonl: on a 64 KiB tmpfs the line that does not fit is one
InputError naming the file, and the lines before it read back whole. Mounting needs root or
CAP_SYS_ADMIN (CI's VM runs as root); skipped with the reason otherwise. The simulated full disk
is tests/unit/test_training_full_disk.py."""

import pytest

from megatron.base.records import read_metrics
from megatron.base.rundir import RunDir
from megatron.config.errors import InputError
from megatron.training.metrics import MetricsWriter
from tests.support.disks import tmpfs
from tests.support.metrics import step_record



def test_a_real_full_disk_under_metrics_jsonl(tmp_path):
    with tmpfs(tmp_path / "disk", "64k") as mnt:
        w = MetricsWriter(RunDir(str(mnt)), tensorboard=False)
        with pytest.raises(InputError, match="metrics.jsonl: no space left on device"):
            for n in range(1, 10000):
                w.write(step_record(n))
        w.close()
        steps = [r.step for r in read_metrics(w.path)]
        assert steps == list(range(1, len(steps) + 1)) and len(steps) > 100
