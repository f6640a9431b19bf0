"""The rules of interleaved pipelines (config/interleaving.py, with the interleaved schedule's
record): each bad setting is one ConfigError, raised by validate_for_world, which the trainer
runs before torch is imported or a process group joined (cli/train.py, training/startup.py).
Each message names the field, its value and a fix that would pass."""
import pytest

from megatron.config import ConfigError, load_config, validate_for_world
from tests.support.paths import TINY

BASE = ["parallel.pipeline_parallel_size=2", "parallel.pipeline_schedule=interleaved",
        "parallel.virtual_pipeline_size=2"]
ZBV = ["parallel.pipeline_parallel_size=2", "parallel.pipeline_schedule=zbv",
       "parallel.virtual_pipeline_size=2"]


def _refusal(overrides, world=2) -> ConfigError:
    cfg = load_config(TINY, overrides)
    with pytest.raises(ConfigError) as e:
        validate_for_world(cfg, world)
    return e.value


# (overrides, world, field, value, words of the message, the fix's overrides that pass)
CASES = {
    "v without stages": (["parallel.virtual_pipeline_size=2"], 1,
                         "parallel.virtual_pipeline_size", 2, ["pipeline_parallel_size=1"],
                         ["parallel.virtual_pipeline_size=1"]),
    "v with DeepSpeed's schedule": (
        BASE[:1] + ["parallel.virtual_pipeline_size=2", "parallel.pipeline_schedule=zbh1"], 2,
        "parallel.virtual_pipeline_size", 2, ["pipeline_schedule=zbh1"],
        ["parallel.pipeline_schedule=interleaved"]),
    "interleaved with v = 1": (BASE[:2], 2, "parallel.pipeline_schedule", "interleaved",
                               ["virtual_pipeline_size > 1"],
                               ["parallel.virtual_pipeline_size=2"]),
    "v not dividing the layers per stage": (
        BASE[:2] + ["parallel.virtual_pipeline_size=3", "model.num_layers=4"], 2,
        "model.num_layers", 4, ["2 x 3 = 6", "holds 2 layers", "virtual_pipeline_size=3"],
        ["parallel.virtual_pipeline_size=2"]),
    "layers not even over stages": (
        BASE + ["model.num_layers=5"], 2, "model.num_layers", 5,
        ["5 layers do not split evenly over 2 stages"], ["model.num_layers=4"]),
    "micro-batches not a multiple of stages": (
        BASE + ["training.global_batch_size=6"], 2, "training.global_batch_size", 6,
        ["6 / (2 x 1) = 3", "pipeline_parallel_size=2"], ["training.global_batch_size=8"]),
    "micro-batches with data parallelism": (
        BASE + ["training.global_batch_size=12"], 4, "training.global_batch_size", 12,
        ["12 / (2 x 2) = 3"], ["training.global_batch_size=16"]),
    "a group leaving a last group under the stages": (
        BASE + ["training.global_batch_size=10", "parallel.pipeline_microbatch_group=4"], 2,
        "parallel.pipeline_microbatch_group", 4, ["the 5 micro-batches", "at least 2"],
        ["parallel.pipeline_microbatch_group=3"]),
    "a group below the stages": (
        BASE + ["parallel.pipeline_microbatch_group=1"], 2,
        "parallel.pipeline_microbatch_group", 1, ["pipeline_parallel_size=2"],
        ["parallel.pipeline_microbatch_group=2"]),
    "a group without chunks": (
        BASE[:1] + ["parallel.pipeline_microbatch_group=2"], 2,
        "parallel.pipeline_microbatch_group", 2, ["groups order the passes of chunks"],
        ["parallel.pipeline_microbatch_group=0"]),
    "a group under ZB-V": (
        ZBV + ["parallel.pipeline_microbatch_group=2"], 2,
        "parallel.pipeline_microbatch_group", 2, ["only the interleaved order"],
        ["parallel.pipeline_microbatch_group=0"]),
    "fp16": (BASE + ["training.precision=fp16"], 2, "training.precision", "fp16",
             ["not tested"], ["training.precision=bf16"]),
    "ZeRO-0": (BASE + ["parallel.zero_stage=0"], 2, "parallel.zero_stage", 0,
               ["first pipeline stage"], ["parallel.zero_stage=1"]),
    "ZB-V with v = 4": (ZBV[:2] + ["parallel.virtual_pipeline_size=4", "model.num_layers=8"], 2,
                        "parallel.virtual_pipeline_size", 4, ["exactly two", "zbv"],
                        ["parallel.virtual_pipeline_size=2"]),
    "ZB-V with v = 1": (ZBV[:2], 2, "parallel.virtual_pipeline_size", 1, ["exactly two"],
                        ["parallel.virtual_pipeline_size=2"]),
}


@pytest.mark.parametrize("name", CASES)
def test_each_bad_setting_is_one_message_naming_field_value_and_fix(name):
    overrides, world, field, value, words, fix = CASES[name]
    error = _refusal(overrides, world)
    text = str(error)
    assert (error.field, error.value) == (field, value), text
    assert text.startswith(f"{field}={value!r} is invalid"), text
    for word in words:
        assert word in text, f"{name}: {word!r} not in {text}"
    for key in fix:
        assert key.split("=")[0] in text, f"{name}: the fix {key} not named in {text}"
    # the fix it names makes the layout valid
    validate_for_world(load_config(TINY, overrides + fix), world)


def test_the_layers_message_offers_the_chunk_counts_that_fit():
    text = str(_refusal(BASE[:2] + ["parallel.virtual_pipeline_size=4",
                                    "model.num_layers=12"]))
    assert "each of the 2 stages holds 6 layers" in text
    assert "set model.num_layers to a multiple of 8" in text
    assert "one of 2, 3, 6" in text


def test_the_micro_batch_message_offers_the_group_that_takes_them():
    """3 micro-batches on 2 stages: a group of 3 runs them (Megatron Core's
    --microbatch-group-size-per-virtual-pipeline-stage), and the message says so."""
    overrides = BASE + ["training.global_batch_size=6"]
    assert "set parallel.pipeline_microbatch_group=3" in str(_refusal(overrides))
    assert validate_for_world(load_config(TINY, overrides + [
        "parallel.pipeline_microbatch_group=3"]), 2) == 1


def test_zbv_takes_any_number_of_micro_batches():
    """ZB-V's order (engine/v_order.py) has no groups of p micro-batches: 3 on 2 stages run."""
    assert validate_for_world(load_config(TINY, ZBV + ["training.global_batch_size=6"]), 2) == 1


def test_bf16_runs_interleaved():
    cfg = load_config(TINY, BASE + ["training.precision=bf16"])
    assert validate_for_world(cfg, 2) == 1


def test_a_valid_interleaved_layout():
    assert validate_for_world(load_config(TINY, BASE), 2) == 1


def test_virtual_pipeline_size_is_positive():
    with pytest.raises(ConfigError):
        load_config(TINY, ["parallel.virtual_pipeline_size=0"])
