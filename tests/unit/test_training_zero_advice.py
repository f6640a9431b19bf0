"""training/startup.zero_without_shards: the start-up note for ZeRO over a sharding group of
one rank (data x context parallel = 1), where it saves no memory and still costs DeepSpeed's
gradient copies, given only where ZeRO-0 is allowed for the same layout."""
import pytest

from megatron.config import load_config, validate_for_world
from megatron.training.startup import zero_without_shards

from tests.support.paths import TINY

INTERLEAVED = ["parallel.pipeline_parallel_size=2", "parallel.pipeline_schedule=interleaved",
               "parallel.virtual_pipeline_size=2", "training.global_batch_size=8"]


def _advice(world, *sets):
    cfg = load_config(TINY, list(sets))
    return zero_without_shards(cfg, world, validate_for_world(cfg, world))


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_zero_over_one_rank_is_named_with_the_fix(zero):
    text = _advice(1, f"parallel.zero_stage={zero}")
    assert f"parallel.zero_stage={zero} shards the optimizer over one data-parallel rank" in text
    assert "parallel.zero_stage=0" in text


@pytest.mark.parametrize("world, sets", [
    (1, ["parallel.zero_stage=0"]),  # nothing to advise
    (2, ["parallel.zero_stage=1"]),  # two data-parallel ranks: ZeRO shards
    (2, ["parallel.zero_stage=1", "parallel.context_parallel_size=2"]),  # shards over CP
    (2, ["parallel.zero_stage=1"] + INTERLEAVED),  # the interleaved order needs ZeRO
])
def test_no_advice_where_zero_shards_or_is_needed(world, sets):
    assert _advice(world, *sets) is None


def test_bf16_at_zero1_is_also_pointed_at_fp32_accumulation():
    text = _advice(1, "parallel.zero_stage=1", "training.precision=bf16")
    assert "parallel.zero_stage=0" in text and "training.grad_accum_dtype=fp32" in text
    assert "grad_accum_dtype" not in _advice(1, "parallel.zero_stage=1")  # fp32 weights
    assert "grad_accum_dtype" not in _advice(1, "parallel.zero_stage=2", "training.precision=bf16")
    # already on BF16_Optimizer: nothing to advise
    assert _advice(1, "parallel.zero_stage=1", "training.precision=bf16",
                   "training.grad_accum_dtype=fp32") is None


def test_tensor_parallel_ranks_alone_still_get_the_advice():
    """TP2 on two ranks: one data-parallel rank, so ZeRO has nothing to shard there either."""
    assert _advice(2, "parallel.zero_stage=1", "parallel.tensor_parallel_size=2") is not None
