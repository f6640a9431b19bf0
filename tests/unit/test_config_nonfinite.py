"""NaN and infinity are refused in every float config field, with one message naming the field:
through the real `megatron-train` (exit 2, no traceback) and for each float field of each section
(a new float field is covered by the same check, and this test finds it)."""
import dataclasses
import typing

import pytest

from megatron.config import load_config
from megatron.config.errors import ConfigError
from megatron.config.sections import SECTIONS
from tests.unit.test_cli_errors import TINY, assert_clean_error, clean_env, run_cli, sets

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


def test_yaml_file_nonfinite_value(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("optimizer:\n  adam_eps: .nan\n")
    with pytest.raises(ConfigError, match=r"optimizer.adam_eps=nan is invalid: expected a "
                                          r"finite number"):
        load_config(str(cfg))


def _float_fields():
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            args = typing.get_args(hints[f.name]) or (hints[f.name],)
            if float in args:
                yield f"{section}.{f.name}"


FLOAT_FIELDS = list(_float_fields())


def test_there_are_float_fields_to_check():
    assert {"optimizer.lr", "training.clip_grad", "model.rotary_base"} <= set(FLOAT_FIELDS)


@pytest.mark.parametrize("key", FLOAT_FIELDS)
@pytest.mark.parametrize("text", [".inf", "-.inf", ".nan", "1e999"])
def test_every_float_field_refuses_nonfinite(key, text):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{key}={text}"])
    assert e.value.field == key and "finite number" in str(e.value)
