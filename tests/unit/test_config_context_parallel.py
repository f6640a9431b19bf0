"""parallel.context_parallel_size: what the layout rules accept and the one message for what
they refuse (each names the fields)."""
import pytest

from megatron.config import ConfigError, load_config, validate_for_world
from megatron.base.deepspeed_json import deepspeed_config
from tests.support.paths import TINY


def _cfg(*overrides):
    return load_config(TINY, list(overrides))


def test_data_parallel_size_is_what_tensor_pipeline_and_context_parallel_leave():
    cfg = _cfg("parallel.context_parallel_size=2", "parallel.tensor_parallel_size=2")
    assert validate_for_world(cfg, 8) == 2


def test_deepspeed_counts_each_context_parallel_rank_of_a_sample():
    cfg = _cfg("parallel.context_parallel_size=2")
    ds = deepspeed_config(cfg, 2)
    # DeepSpeed checks train_batch == micro x accumulation x its data-parallel group (dp x cp)
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * \
        ds["gradient_accumulation_steps"] * 2 * 2
    plain = _cfg()
    assert deepspeed_config(plain, 2)["train_batch_size"] == plain.training.global_batch_size


@pytest.mark.parametrize("overrides, world, words", [
    (["parallel.context_parallel_size=3"], 3, "model.num_attention_heads=4"),
    (["parallel.context_parallel_size=4", "parallel.tensor_parallel_size=2"], 8,
     "query heads per tensor-parallel rank (num_attention_heads / parallel.tensor_parallel_size"
     " = 2) to be a multiple of parallel.context_parallel_size=4"),
    (["parallel.context_parallel_size=2", "model.seq_length=63"], 2,
     "model.seq_length=63 is invalid: expected a multiple of parallel.context_parallel_size=2"),
    (["parallel.context_parallel_size=2", "parallel.tensor_parallel_size=2",
      "parallel.sequence_parallel=true", "model.seq_length=66"], 4,
     "context_parallel_size x tensor_parallel_size = 4 with sequence parallelism"),
    (["parallel.context_parallel_size=2"], 3, "context_parallel_size (1 x 1 x 2 = 2)"),
    (["parallel.context_parallel_size=0"], 1, "parallel.context_parallel_size=0"),
])
def test_a_layout_that_cannot_work_is_one_message_naming_the_fields(overrides, world, words):
    with pytest.raises(ConfigError) as e:
        validate_for_world(_cfg(*overrides), world)
    assert words in str(e.value)


@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("zbh1", 1), ("interleaved", 2),
                                         ("zbv", 2)])
def test_every_pipeline_schedule_runs_with_context_parallelism(schedule, v):
    """Each rank sends its 1/cp of the sequence between stages or chunks: no schedule is
    refused with CP (tests/distributed/test_parallel_ring_attention.py runs them)."""
    cfg = _cfg("parallel.context_parallel_size=2", "parallel.pipeline_parallel_size=2",
               f"parallel.pipeline_schedule={schedule}", f"parallel.virtual_pipeline_size={v}",
               "training.global_batch_size=8")
    assert validate_for_world(cfg, 4) == 1


def test_fewer_key_value_heads_than_the_degree_is_accepted():
    cfg = _cfg("parallel.context_parallel_size=4", "model.num_query_groups=1")
    assert validate_for_world(cfg, 4) == 1


@pytest.mark.parametrize("overrides, world, words", [
    (["parallel.context_parallel_algo=tree"], 1,
     "parallel.context_parallel_algo='tree' is invalid: expected one of ulysses, ring, "
     "allgather, hybrid"),
    (["parallel.context_parallel_size=4", "parallel.context_parallel_algo=ring",
      "model.seq_length=36"], 4,
     "model.seq_length=36 is invalid: expected a multiple of 2 x the ring degree = 8"),
    (["parallel.context_parallel_size=4", "parallel.context_parallel_algo=hybrid"], 4,
     "parallel.ulysses_degree=0 is invalid: expected a divisor of "
     "parallel.context_parallel_size=4 between 2 and 2"),
    (["parallel.context_parallel_size=8", "parallel.context_parallel_algo=hybrid",
      "parallel.ulysses_degree=8"], 8, "parallel.ulysses_degree=8"),
    (["parallel.context_parallel_size=2", "parallel.ulysses_degree=2",
      "parallel.context_parallel_algo=ring"], 2,
     "expected 0 or 1 with parallel.context_parallel_algo=ring"),
    (["parallel.context_parallel_size=8", "parallel.context_parallel_algo=hybrid",
      "parallel.ulysses_degree=4", "parallel.tensor_parallel_size=2"], 16,
     "parallel.ulysses_degree=4 is invalid: expected a divisor of the query heads per "
     "tensor-parallel rank (num_attention_heads / parallel.tensor_parallel_size = 2)"),
    (["parallel.context_parallel_size=8"], 8,
     "or set parallel.context_parallel_algo=ring (no head cap)"),
    # a Ulysses degree without context parallelism used to be dropped unread
    (["parallel.ulysses_degree=2"], 1,
     "parallel.ulysses_degree=2 is invalid: expected 0 without context parallelism"),
    (["parallel.ulysses_degree=2", "parallel.context_parallel_algo=hybrid"], 1,
     "or parallel.ulysses_degree=0"),
])
def test_an_algorithm_that_cannot_split_is_one_message_naming_the_fields(overrides, world,
                                                                         words):
    with pytest.raises(ConfigError) as e:
        validate_for_world(_cfg(*overrides), world)
    assert words in str(e.value)


@pytest.mark.parametrize("overrides, world", [
    # past the Ulysses head cap (tiny has 4 query heads): the ring has none
    (["parallel.context_parallel_size=8", "parallel.context_parallel_algo=ring"], 8),
    (["parallel.context_parallel_size=8", "parallel.context_parallel_algo=allgather"], 8),
    (["parallel.context_parallel_size=8", "parallel.context_parallel_algo=hybrid",
      "parallel.ulysses_degree=4"], 8),
    (["parallel.context_parallel_size=2", "parallel.context_parallel_algo=ring",
      "parallel.ulysses_degree=1"], 2),
])
def test_ring_allgather_and_hybrid_lift_the_head_cap(overrides, world):
    assert validate_for_world(_cfg(*overrides), world) == 1
