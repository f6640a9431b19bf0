"""NaN and infinity are refused in every float config field, with one message naming the field,
for each float field of each section (a new float field is covered by the same check, and this
test finds it). Through the real `megatron-train`: tests/integration/test_config_nonfinite_cli.py."""
import dataclasses
import typing

import pytest

from megatron.config import load_config
from megatron.config.errors import ConfigError
from megatron.config.reference import documented


def test_yaml_file_nonfinite_value(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("optimizer:\n  adam_eps: .nan\n")
    with pytest.raises(ConfigError, match=r"optimizer.adam_eps=nan is invalid: expected a "
                                          r"finite number"):
        load_config(str(cfg))


def _float_fields():
    for section, cls in documented().items():  # the sections and sub-sections (model.moe)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            args = typing.get_args(hints[f.name]) or (hints[f.name],)
            if float in args:
                yield f"{section}.{f.name}"


FLOAT_FIELDS = list(_float_fields())


def test_there_are_float_fields_to_check():
    assert {"optimizer.lr", "training.clip_grad", "model.rotary_base",
            "model.moe.aux_loss_coeff"} <= set(FLOAT_FIELDS)


@pytest.mark.parametrize("key", FLOAT_FIELDS)
@pytest.mark.parametrize("text", [".inf", "-.inf", ".nan", "1e999"])
def test_every_float_field_refuses_nonfinite(key, text):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{key}={text}"])
    assert e.value.field == key and "finite number" in str(e.value)
