"""The layout record written beside each checkpoint and the rules that refuse a resume it does
not fit: TP and PP always, the data-parallel size whenever ZeRO partitions the optimizer, and any
change of a weight's shape."""
import logging

import pytest

from megatron.config import load_config
from megatron.config.errors import InputError
from megatron.checkpoint.layout import check_resume_layout, layout_record, write_layout


def record(dp=1, **sets):
    cfg = load_config(None, [f"{k}={v}" for k, v in sets.items()])
    return layout_record(cfg, dp, 512)


def saved(tmp_path, rec, tag="step_0000004"):
    (tmp_path / tag).mkdir()
    write_layout(str(tmp_path / tag), rec)
    (tmp_path / "latest").write_text(tag)
    return str(tmp_path)


def test_the_same_layout_resumes(tmp_path):
    rec = record(2, **{"parallel.tensor_parallel_size": 2})
    check_resume_layout(saved(tmp_path, rec), None, rec)


@pytest.mark.parametrize("now, words", [
    (dict(dp=1, **{"parallel.tensor_parallel_size": 1}), "TP2 PP1 DP2 ZeRO-1 run and this run "
                                                         "is TP1 PP1 DP1 ZeRO-1"),
    (dict(dp=1, **{"parallel.tensor_parallel_size": 2, "parallel.pipeline_parallel_size": 2}),
     "this run is TP2 PP2 DP1"),
    (dict(dp=4, **{"parallel.tensor_parallel_size": 2}), "ZeRO partitions the optimizer state"),
    (dict(dp=2, **{"parallel.tensor_parallel_size": 2, "parallel.zero_stage": 2}),
     "this run is TP2 PP1 DP2 ZeRO-2"),
])
def test_another_layout_is_refused_with_both_named(tmp_path, now, words):
    folder = saved(tmp_path, record(2, **{"parallel.tensor_parallel_size": 2}))
    with pytest.raises(InputError, match="was written by a TP2 PP1 DP2 ZeRO-1 run") as e:
        check_resume_layout(folder, None, record(**now))
    assert words in str(e.value)
    assert "--set parallel.tensor_parallel_size=2" in str(e.value) and "on 4 ranks" in str(e.value)


def test_without_zero_the_data_parallel_size_may_change(tmp_path):
    folder = saved(tmp_path, record(2, **{"parallel.zero_stage": 0}))
    check_resume_layout(folder, None, record(4, **{"parallel.zero_stage": 0}))


def test_another_model_is_refused_field_by_field(tmp_path):
    folder = saved(tmp_path, record(1))
    with pytest.raises(InputError, match="holds another model") as e:
        check_resume_layout(folder, "step_0000004",
                            record(1, **{"model.num_layers": 3, "model.activation": "swiglu"}))
    assert "model.num_layers: checkpoint 2, this run 3" in str(e.value)
    assert "model.activation: checkpoint 'gelu', this run 'swiglu'" in str(e.value)


def test_a_checkpoint_without_a_record_is_resumed_with_a_warning(tmp_path, caplog):
    (tmp_path / "step_0000002").mkdir()
    (tmp_path / "latest").write_text("step_0000002")
    with caplog.at_level(logging.WARNING):
        check_resume_layout(str(tmp_path), None, record(1))
    assert "its layout is not checked" in caplog.text
