"""A real full disk through megatron-train: run.dir on a 1 MiB tmpfs holds the run files but not
the first checkpoint. The run ends with exit 2 and one `megatron-train: error:` line naming the
shard, 'no space left on device' and the bytes it needed, no traceback, and no staging folder
left on the full disk. Needs permission to mount a tmpfs (root, as CI's VM runs); skipped
otherwise. The simulated full disk of every writer is tests/unit/test_checkpoint_full_disk.py."""
import os

import pytest

from tests.support.cli import assert_clean_error, clean_env, run_cli, sets
from tests.support.disks import tmpfs
from tests.support.paths import TINY


@pytest.fixture
def tiny_disk(tmp_path):
    with tmpfs(tmp_path / "disk", "1m") as mnt:
        yield mnt


def test_a_checkpoint_on_a_full_disk_is_one_error_and_leaves_no_staging_folder(tiny_disk):
    run = tiny_disk / "run"
    proc = run_cli(["--config", TINY, *sets(f"run.dir={run}", "training.train_iters=2",
                                            "training.save=true", "training.tensorboard=false")],
                   clean_env())
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("megatron-train: error: "), proc.stderr
    assert_clean_error(proc, "no space left on device",
                       "shards/tp00_pp000_dp00000.pt", "needs at least", "bytes free",
                       "was removed")
    assert "enforce fail" not in proc.stderr
    assert os.listdir(run / "checkpoints") == []
    assert sorted(os.listdir(run)) == [".lock", "checkpoints", "config.yaml", "deepspeed.json",
                                       "metrics.jsonl"]
