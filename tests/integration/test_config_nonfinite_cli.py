"""NaN and infinity are refused through the real `megatron-train`: exit 2, no traceback, one
message naming the field (each float field in process: tests/unit/test_config_nonfinite.py)."""
import pytest

from tests.support.cli import assert_clean_error, clean_env, run_cli, sets
from tests.support.paths import TINY

CLI_CASES = [
    ("lr_inf", "optimizer.lr=.inf", "optimizer.lr=inf"),
    ("lr_overflow", "optimizer.lr=1e999", "optimizer.lr=inf"),
    ("clip_grad_nan", "training.clip_grad=.nan", "training.clip_grad=nan"),
]


@pytest.mark.parametrize("item, fragment", [c[1:] for c in CLI_CASES],
                         ids=[c[0] for c in CLI_CASES])
def test_cli_refuses_nonfinite_values(item, fragment):
    proc = run_cli(["--config", TINY] + sets(item), clean_env())
    assert_clean_error(proc, fragment, "expected a finite number")
    assert proc.returncode == 2
    assert proc.stderr.count("error:") == 1


def test_cli_refuses_plain_nan_text():
    proc = run_cli(["--config", TINY] + sets("optimizer.lr=nan"), clean_env())
    assert_clean_error(proc, "optimizer.lr='nan'", "expected a number")
    assert proc.returncode == 2
