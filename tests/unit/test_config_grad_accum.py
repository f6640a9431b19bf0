"""training.grad_accum_dtype: fp32 gradient accumulation for bf16 weights, which DeepSpeed runs
with its BF16_Optimizer at ZeRO-1. The key it writes into deepspeed.json, the combinations it
refuses (naming the field, the value and the fix), the optimizer kind the planner prices and the
memory it adds. That DeepSpeed takes BF16_Optimizer for this JSON, and that its checkpoints
resume and continue under ZeRO-1's own optimizer, is tested by running it
(tests/distributed/test_checkpoint_layouts.py, tests/e2e/test_training_bench_e2e.py)."""

import pytest

from megatron.base.deepspeed_json import deepspeed_config
from megatron.base.optimizer_kind import optimizer_kind
from megatron.config import ConfigError, load_config
from megatron.config.validate import validate_for_world
from megatron.planner import fit
from tests.support.paths import TINY

FP32 = ["training.precision=bf16", "parallel.zero_stage=1", "training.grad_accum_dtype=fp32"]


def test_default_keeps_the_model_dtype_and_writes_no_data_types():
    cfg = load_config(TINY, ["training.precision=bf16", "parallel.zero_stage=1"])
    assert cfg.training.grad_accum_dtype == "model"
    assert "data_types" not in deepspeed_config(cfg, 1)
    assert optimizer_kind("bf16", 1, 1) == "zero"


def test_fp32_with_bf16_at_zero1_asks_deepspeed_for_fp32_accumulation():
    cfg = load_config(TINY, FP32)
    validate_for_world(cfg, 2)
    ds = deepspeed_config(cfg, 2)
    assert ds["data_types"] == {"grad_accum_dtype": "fp32"}
    # each bf16 gradient is added into the fp32 buffer as it lands, and freed
    assert ds["bf16"] == {"enabled": True, "immediate_grad_update": True}
    assert ds["zero_optimization"]["stage"] == 1
    assert optimizer_kind("bf16", 1, 1, "fp32") == "bf16"
    assert optimizer_kind("bf16", 1, 2, "fp32") == "bf16"   # under a pipeline too


@pytest.mark.parametrize("overrides, fragments", [
    (["training.precision=fp32", "parallel.zero_stage=1"], ["training.precision=fp32",
                                                            "training.precision=bf16"]),
    (["training.precision=bf16", "parallel.zero_stage=0"], ["parallel.zero_stage=0",
                                                            "parallel.zero_stage=1"]),
    (["training.precision=bf16", "parallel.zero_stage=2"], ["parallel.zero_stage=2"]),
    (["training.precision=bf16", "parallel.zero_stage=3"], ["parallel.zero_stage=3"]),
    (["training.precision=bf16", "parallel.zero_stage=1", "model.moe.num_experts=4"],
     ["model.moe.num_experts=4", "experts"]),
])
def test_combinations_deepspeed_does_not_run_are_refused_with_the_fix(overrides, fragments):
    cfg = load_config(TINY, overrides + ["training.grad_accum_dtype=fp32"])
    with pytest.raises(ConfigError) as err:
        validate_for_world(cfg, 2)
    text = str(err.value)
    for fragment in ["training.grad_accum_dtype", "fp32", "grad_accum_dtype=model", *fragments]:
        assert fragment in text, text


def test_an_unknown_value_names_the_choices():
    with pytest.raises(ConfigError) as err:
        load_config(TINY, ["training.grad_accum_dtype=fp16"])
    assert "training.grad_accum_dtype" in str(err.value) and "fp32" in str(err.value)


def test_the_planner_prices_the_fp32_gradient_buffer():
    """BF16_Optimizer holds every gradient in fp32 (unsharded) beside the bf16 ones autograd
    writes, and no ZeRO bucket: what the memory check megatron-train runs before it starts
    prices."""
    base = ["training.precision=bf16", "parallel.zero_stage=1"]
    _, zero = fit.predict(load_config(TINY, base), 1, "gpu")
    _, fp32 = fit.predict(load_config(TINY, FP32), 1, "gpu")
    n = zero.params
    # one rank reduces nothing, so ZeRO-1 has no bucket there (base/deepspeed_json.py); two do
    assert (zero.weights, zero.grads, zero.bucket) == (2 * n, 2 * n, 0)
    assert fit.predict(load_config(TINY, base), 2, "gpu")[1].bucket > 0
    assert (fp32.weights, fp32.grads, fp32.bucket) == (2 * n, 6 * n, 0)
    assert fp32.optimizer == zero.optimizer == 12 * n


def test_the_planner_prices_its_all_reduce_where_zero1_reduce_scatters():
    """At 64 data-parallel ranks BF16_Optimizer all-reduces the gradients (twice ZeRO-1's
    reduce-scatter on the wire) and still all-gathers the updated weights: a slower step; at one
    rank the two cost the same."""
    from megatron.config import ModelConfig
    from megatron.planner.layout import Job, Layout
    from megatron.planner.profile import load_profile
    from megatron.planner.timing import step_time
    prof = load_profile("h200")
    model = ModelConfig(num_layers=24, hidden_size=2048, num_attention_heads=16,
                        seq_length=2048, vocab_size=50304)

    def step(grad_accum, dp):
        job = Job(model, 8 * dp, "bf16", grad_accum=grad_accum)
        lay = Layout(tp=1, pp=1, dp=dp, micro_batch=8, grad_accum=1, zero=1)
        return step_time(job, lay, prof).step_s

    assert step("fp32", 64) > step("model", 64)
    assert step("fp32", 1) == pytest.approx(step("model", 1))
