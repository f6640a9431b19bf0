"""The `deepspeed:` section and the communication defaults of the generated deepspeed.json.

A failure here localizes to megatron/config/deepspeed_section.py (allow-list, refusals, --set
paths, merging) or megatron/base/deepspeed_json.py (device defaults, the bucket rule, the
merge into the generated JSON); the DeepSpeed tests fail when DeepSpeed renames a key we allow."""

import pytest

from megatron.config import ConfigError, load_config
from megatron.base.deepspeed_json import (DEEPSPEED_BUCKET, MIN_GPU_BUCKET, config_settings,
                                            deepspeed_config, gpu_bucket_size)
from megatron.config.deepspeed_section import OWNED, allowed_keys
from megatron.config.validate import validate_for_world
from tests.support.paths import TINY


SECTION_YAML = """\
deepspeed:
  communication_data_type: fp32
  zero_optimization:
    reduce_bucket_size: 2e8
    overlap_comm: true
  comms_logger:
    enabled: true
    prof_ops: [all_reduce]
"""


def tiny(tmp_path, extra: str = "", overrides=()):
    path = tmp_path / "c.yaml"
    path.write_text(open(TINY).read() + extra)
    return load_config(str(path), list(overrides))


# --- merging ---------------------------------------------------------------------------------

def test_yaml_section_is_typed_and_merged_into_the_json(tmp_path):
    cfg = tiny(tmp_path, SECTION_YAML)
    assert cfg.deepspeed["zero_optimization"]["reduce_bucket_size"] == 200_000_000  # "2e8" read
    ds = deepspeed_config(cfg, 2)
    assert ds["communication_data_type"] == "fp32"
    assert ds["comms_logger"] == {"enabled": True, "prof_ops": ["all_reduce"]}
    # nested: the section's keys join the generated block instead of replacing it
    assert ds["zero_optimization"] == {"stage": 1, "overlap_comm": True,
                                       "contiguous_gradients": True,
                                       "reduce_bucket_size": 200_000_000,
                                       "allgather_bucket_size": DEEPSPEED_BUCKET}
    assert ds["train_batch_size"] == 16 and ds["gradient_clipping"] == 1.0


def test_set_paths_merge_with_the_file_key_by_key(tmp_path):
    cfg = tiny(tmp_path, SECTION_YAML, ["deepspeed.zero_optimization.allgather_bucket_size=1e8",
                                        "deepspeed.zero_optimization.overlap_comm=false",
                                        "deepspeed.zero_optimization.overlap_comm=null",
                                        "deepspeed.comms_logger=null"])
    zero = cfg.deepspeed["zero_optimization"]
    # the file's bucket stays, the new key joins, null unsets (the later --set wins)
    assert zero == {"reduce_bucket_size": 200_000_000, "allgather_bucket_size": 100_000_000}
    assert "comms_logger" not in cfg.deepspeed
    assert deepspeed_config(cfg, 1)["zero_optimization"]["overlap_comm"] is False  # CPU default


def test_set_accepts_a_mapping_value_and_the_resolved_yaml_round_trips(tmp_path):
    cfg = load_config(TINY, ["deepspeed.zero_optimization={overlap_comm: true}",
                             "deepspeed.steps_per_print=50"])
    assert cfg.deepspeed == {"zero_optimization": {"overlap_comm": True}, "steps_per_print": 50}
    path = tmp_path / "resolved.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(str(path)).to_dict() == cfg.to_dict()


def test_no_section_generates_what_it_always_did():
    """Without a deepspeed section, on the CPU, the JSON of a data-parallel run is the
    pre-section one plus the bucket sizes DeepSpeed used anyway (5e8)."""
    ds = deepspeed_config(load_config(TINY), 2)
    assert ds == {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
                  "gradient_accumulation_steps": 4, "gradient_clipping": 1.0,
                  "steps_per_print": 10 ** 9, "wall_clock_breakdown": False,
                  "zero_optimization": {"stage": 1, "overlap_comm": False,
                                        "contiguous_gradients": True,
                                        "reduce_bucket_size": DEEPSPEED_BUCKET,
                                        "allgather_bucket_size": DEEPSPEED_BUCKET},
                  "zero_allow_untested_optimizer": True}


# --- device defaults -------------------------------------------------------------------------

@pytest.mark.parametrize("zero", [1, 2, 3])
def test_gpu_overlaps_and_sizes_the_bucket_cpu_does_not(zero):
    cfg = load_config(TINY, [f"parallel.zero_stage={zero}", "model.hidden_size=4096",
                             "model.num_attention_heads=32"])
    gpu = deepspeed_config(cfg, 2, "cuda")["zero_optimization"]
    cpu = deepspeed_config(cfg, 2, "cpu")["zero_optimization"]
    assert gpu["overlap_comm"] is True and cpu["overlap_comm"] is False
    assert gpu["reduce_bucket_size"] == gpu_bucket_size(4096, 1) == 12 * 4096 ** 2
    assert cpu["reduce_bucket_size"] == DEEPSPEED_BUCKET
    assert gpu["allgather_bucket_size"] == cpu["allgather_bucket_size"] == DEEPSPEED_BUCKET
    assert deepspeed_config(cfg, 2) == deepspeed_config(cfg, 2, "cpu")  # the default is the CPU


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("zero", [1, 2])
def test_a_zero_group_of_one_rank_registers_no_gradient_hooks(device, zero):
    """With data x context parallel = 1 there is nothing to reduce: overlap_comm and
    contiguous_gradients are off (DeepSpeed then registers no per-parameter backward hook),
    unless the section says otherwise; a group of two keeps the defaults; ZeRO-3 keeps its own."""
    cfg = load_config(TINY, [f"parallel.zero_stage={zero}"])
    alone = deepspeed_config(cfg, 1, device)["zero_optimization"]
    assert (alone["overlap_comm"], alone["contiguous_gradients"]) == (False, False)
    pair = deepspeed_config(cfg, 2, device)["zero_optimization"]
    assert (pair["overlap_comm"], pair["contiguous_gradients"]) == (device == "cuda", True)
    cp = load_config(TINY, [f"parallel.zero_stage={zero}", "parallel.context_parallel_size=2"])
    assert deepspeed_config(cp, 1, device)["zero_optimization"]["contiguous_gradients"] is True
    z3 = load_config(TINY, ["parallel.zero_stage=3"])
    assert deepspeed_config(z3, 1, device)["zero_optimization"]["contiguous_gradients"] is True
    kept = load_config(TINY, [f"parallel.zero_stage={zero}",
                              "deepspeed.zero_optimization.contiguous_gradients=true"])
    assert deepspeed_config(kept, 1, device)["zero_optimization"]["contiguous_gradients"] is True


def test_gpu_defaults_leave_pipelines_and_zero0_alone():
    pp = load_config(TINY, ["parallel.pipeline_parallel_size=2"])
    assert deepspeed_config(pp, 1, "cuda")["zero_optimization"]["overlap_comm"] is False
    z0 = load_config(TINY, ["parallel.zero_stage=0"])
    assert deepspeed_config(z0, 1, "cuda")["zero_optimization"] == {"stage": 0}


def test_communication_dtype_is_left_to_precision_unless_set():
    cfg = load_config(TINY, ["training.precision=bf16"])
    assert "communication_data_type" not in deepspeed_config(cfg, 1, "cuda")
    assert config_settings(cfg, 2, "cuda").communication_data_type is None
    cfg = load_config(TINY, ["deepspeed.communication_data_type=fp32"])
    assert deepspeed_config(cfg, 1, "cuda")["communication_data_type"] == "fp32"


@pytest.mark.parametrize("hidden, tp, want", [
    (64, 1, MIN_GPU_BUCKET),             # tiny: floored, collectives stay bandwidth-bound
    (2048, 1, 12 * 2048 ** 2),           # one layer, already a multiple of 2**20
    (12288, 4, 432 * 2 ** 20),           # 175B, one layer per TP-4 rank
    (5000, 1, 287 * 2 ** 20),            # 3e8 rounded up to a multiple of 2**20
    (12288, 1, DEEPSPEED_BUCKET),        # capped at DeepSpeed's 5e8
])
def test_gpu_bucket_rule(hidden, tp, want):
    got = gpu_bucket_size(hidden, tp)
    assert got == want and got % 2 == 0


def test_explicit_values_beat_device_defaults():
    cfg = load_config(TINY, ["deepspeed.zero_optimization.overlap_comm=false",
                             "deepspeed.zero_optimization.reduce_bucket_size=123456"])
    s = config_settings(cfg, 2, "cuda")
    assert (s.overlap_comm, s.reduce_bucket_size) == (False, 123456)
    assert deepspeed_config(cfg, 1, "cuda")["zero_optimization"]["reduce_bucket_size"] == 123456


# --- refusals --------------------------------------------------------------------------------

@pytest.mark.parametrize("key", sorted(OWNED))
def test_every_owned_key_is_refused_naming_the_project_key(key):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, [f"deepspeed.{key}=1"])
    assert e.value.field == f"deepspeed.{key}"
    assert OWNED[key] in str(e.value) and "remove it and set" in str(e.value)


def test_owned_key_in_yaml_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"deepspeed.optimizer='\{\.\.\.\}' is invalid: .*"
                                          r"the optimizer section"):
        tiny(tmp_path, "deepspeed:\n  optimizer:\n    type: Adam\n    params: {lr: 0.1}\n")
    with pytest.raises(ConfigError, match=r"deepspeed.zero_optimization.stage=3 .* "
                                          r"parallel.zero_stage"):
        tiny(tmp_path, "deepspeed:\n  zero_optimization:\n    stage: 3\n")


@pytest.mark.parametrize("override, fragments", [
    ("deepspeed.zero_optimization.overlap_com=true", ["known", "overlap_comm"]),
    ("deepspeed.zero_optimization.offload_optimizer={device: cpu}", ["passes through"]),
    ("deepspeed.flops_profiler.enabled=true", ["passes through", "communication_data_type"]),
    ("deepspeed.steps_per_print.every=3", ["takes a single value"]),
    ("deepspeed.zero_optimization.reduce_bucket_size=0", ["a whole number >= 1"]),
    ("deepspeed.zero_optimization.reduce_bucket_size=1.5", ["a whole number"]),
    ("deepspeed.zero_optimization.allgather_bucket_size=3", ["an even number"]),
    ("deepspeed.zero_optimization.overlap_comm=sometimes", ["true or false"]),
    ("deepspeed.communication_data_type=fp8", ["one of fp32, fp16, bf16"]),
    ("deepspeed.zero_optimization=4", ["a mapping of keys"]),
])
def test_bad_keys_and_values_name_the_path(override, fragments):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, [override])
    # the message names the path up to the offending key
    assert override.split("=", 1)[0].startswith(e.value.field), str(e.value)
    for fragment in fragments:
        fragment = "a DeepSpeed key this project" if fragment == "known" else fragment
        assert fragment in str(e.value), str(e.value)


def test_unknown_section_message_lists_deepspeed():
    with pytest.raises(ConfigError, match="run, deepspeed"):
        load_config(None, ["deepsped.zero_optimization.overlap_comm=true"])


def test_explicit_overlap_with_pipeline_is_refused_for_the_layout():
    cfg = load_config(TINY, ["parallel.pipeline_parallel_size=2",
                             "deepspeed.zero_optimization.overlap_comm=true"])
    with pytest.raises(ConfigError, match=r"deepspeed.zero_optimization.overlap_comm=True .*"
                                          r"pipeline_parallel_size=2"):
        validate_for_world(cfg, 2)
    validate_for_world(load_config(TINY, ["deepspeed.zero_optimization.overlap_comm=true"]), 2)


# --- against DeepSpeed 0.19 ------------------------------------------------------------------

SAMPLES = {
    "communication_data_type": "bf16", "memory_breakdown": True, "steps_per_print": 7,
    "wall_clock_breakdown": True,
    "comms_logger.enabled": True, "comms_logger.verbose": False, "comms_logger.prof_all": False,
    "comms_logger.debug": False, "comms_logger.prof_ops": ["all_reduce"],
    "zero_optimization.overlap_comm": True, "zero_optimization.contiguous_gradients": False,
    "zero_optimization.reduce_scatter": False, "zero_optimization.reduce_bucket_size": 1234,
    "zero_optimization.allgather_bucket_size": 5678,
    "zero_optimization.allgather_partitions": False,
    "zero_optimization.use_multi_rank_bucket_allreduce": False,
    "zero_optimization.round_robin_gradients": True,
    "zero_optimization.stage3_prefetch_bucket_size": 11,
    "zero_optimization.stage3_param_persistence_threshold": 12,
    "zero_optimization.stage3_max_live_parameters": 13,
    "zero_optimization.stage3_max_reuse_distance": 14,
}
# Where DeepSpeed's parsed config keeps each top-level value.
PARSED = {"communication_data_type": ("communication_data_type", "torch.bfloat16"),
          "memory_breakdown": ("memory_breakdown", True), "steps_per_print": ("steps_per_print", 7),
          "wall_clock_breakdown": ("wall_clock_breakdown", True)}


def test_every_allowed_key_has_a_sample():
    assert sorted(SAMPLES) == allowed_keys()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_deepspeed_parses_every_allowed_key(precision):
    """DeepSpeed's own parser (extra keys forbidden in zero_optimization and comms_logger) reads
    the generated JSON with every allowed key set, and each lands where DeepSpeed reads it."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    overrides = [f"deepspeed.{k}={v}" for k, v in SAMPLES.items()]
    cfg = load_config(TINY, [f"training.precision={precision}", "parallel.zero_stage=3",
                             "training.global_batch_size=2", *overrides])
    parsed = DeepSpeedConfig(deepspeed_config(cfg, 1, "cuda"))
    zero = parsed.zero_config
    for key, value in SAMPLES.items():
        if key.startswith("zero_optimization."):
            name = key.split(".", 1)[1]
            field = next(f for f, info in type(zero).model_fields.items()
                         if name in (f, info.alias))
            assert getattr(zero, field) == value, key
        elif key.startswith("comms_logger."):
            assert getattr(parsed.comms_config.comms_logger, key.split(".", 1)[1]) == value
        else:
            attr, want = PARSED[key]
            got = getattr(parsed, attr)
            assert (str(got) if attr == "communication_data_type" else got) == want, key
    assert zero.stage == 3 and parsed.train_batch_size == 2


def test_deepspeed_would_reject_a_misspelled_zero_key():
    """The parse test above has teeth: DeepSpeed itself refuses unknown ZeRO keys."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    ds = deepspeed_config(load_config(TINY), 1)
    ds["zero_optimization"]["overlap_com"] = True
    with pytest.raises(Exception, match="overlap_com"):
        DeepSpeedConfig(ds)
