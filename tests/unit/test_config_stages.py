"""Uneven pipeline stages (config/stages.py, parallel.pipeline_first/last_stage_layers): the
split, the stage bounds the trainer gives DeepSpeed's pipeline module (the even split must land
exactly where DeepSpeed's own type-balanced partitioning puts it, so that only the counts
change), and one message for each bad setting, before anything is built."""
import pytest

from megatron.config import ConfigError, load_config
from megatron.config.stages import stage_layers, uneven_problem
from megatron.config.validate import pipeline_stage_layers, validate_for_world
from megatron.engine.model import stage_bounds
from megatron.model.gpt import PipeLayer
from tests.support.paths import TINY


class Embedding:
    pass


class TransformerLayer:
    pass


class LayerNorm:
    pass


def _layers(n):
    return ([PipeLayer(Embedding, (), "embedding")]
            + [PipeLayer(TransformerLayer, (), f"layers.{i}") for i in range(n)]
            + [PipeLayer(LayerNorm, (), "final_norm"), PipeLayer(Embedding, (), "embedding")])


def test_the_split_follows_megatrons_rule():
    assert stage_layers(126, 16, 7, 7) == [7] + [8] * 14 + [7]  # Llama 3 405B's
    assert stage_layers(4, 2, 1, None) == [1, 3]
    assert stage_layers(4, 2, None, 1) == [3, 1]
    assert stage_layers(10, 4) == [3, 3, 2, 2]  # even: the first stages take the remainder
    assert uneven_problem(126, 16, 7, 7) is None
    assert uneven_problem(10, 4, 1, 1) is None  # 8 over 2 middle stages
    assert "not an even split" in uneven_problem(10, 4, 1, 2)  # 7 over 2
    assert uneven_problem(10, 4, 2, 2) is None
    assert "at least 1 layer" in uneven_problem(4, 2, 0, None)
    # with model chunks the counts are the first and last chunk's, the rest even over the others
    assert uneven_problem(6, 2, 1, 1, chunks=2) is None          # 4 over 2 middle chunks
    assert uneven_problem(8, 2, 2, None, chunks=2) is None        # 6 over 3 chunks
    assert "7 of the 9 layers for 3 other model chunk(s) of the 2 x 2" in \
        uneven_problem(9, 2, 2, None, chunks=2)
    assert "5 other model chunk(s) of the 2 x 3" in uneven_problem(8, 2, 2, None, chunks=3)
    assert stage_layers(8, 6, 3) == [3, 1, 1, 1, 1, 1]


def test_model_chunks_place_the_set_counts_on_the_end_chunks():
    """6 layers, PP2 x 2 chunks, first and last 1: chunks [1, 2, 2, 1]. Interleaved 1F1B's loop
    gives rank 0 chunks 0 and 2 (3 layers) and rank 1 chunks 1 and 3 (3); ZB-V's V gives rank 0
    chunks 0 and 3, the embedding's and the head's (2 layers), rank 1 chunks 1 and 2 (4)."""
    from megatron.config.stages import rank_layers
    from megatron.engine.chunks import chunk_slices
    assert stage_layers(6, 4, 1, 1) == [1, 2, 2, 1]
    assert rank_layers(6, 2, 2, False, 1, 1) == [3, 3]
    assert rank_layers(6, 2, 2, True, 1, 1) == [2, 4]
    assert rank_layers(8, 2, 2, True) == [4, 4]
    # pipeline_layers' list: embedding, 6 layers, final norm, head
    assert chunk_slices(6, 4, [1, 2, 2, 1]) == [(0, 2), (2, 4), (4, 6), (6, 9)]
    assert chunk_slices(8, 4) == [(0, 3), (3, 5), (5, 7), (7, 11)]


def test_set_counts_with_model_chunks_reach_the_chunks():
    chunked = ["parallel.pipeline_schedule=interleaved", "parallel.virtual_pipeline_size=2",
               "training.global_batch_size=16", "model.num_layers=6"]
    cfg = _cfg(*chunked, "parallel.pipeline_first_stage_layers=1",
               "parallel.pipeline_last_stage_layers=1")
    validate_for_world(cfg, 2)
    assert pipeline_stage_layers(cfg) == [1, 2, 2, 1]
    zbv = _cfg("parallel.pipeline_schedule=zbv", "parallel.virtual_pipeline_size=2",
               "model.num_layers=7", "parallel.pipeline_first_stage_layers=1")
    validate_for_world(zbv, 2)
    assert pipeline_stage_layers(zbv) == [1, 2, 2, 2]


@pytest.mark.parametrize("layers, pp", [(4, 2), (4, 4), (7, 3), (12, 4), (5, 2)])
def test_the_even_split_lands_where_deepspeeds_partitioning_does(layers, pp):
    from deepspeed.runtime.utils import partition_balanced
    specs = _layers(layers)
    binary = [1 if s.cls is TransformerLayer else 0 for s in specs]
    assert stage_bounds(specs, stage_layers(layers, pp)) == partition_balanced(binary, pp)


def test_uneven_bounds_keep_the_embedding_first_and_the_head_last():
    specs = _layers(4)  # 0 embedding, 1-4 layers, 5 norm, 6 tied head
    assert stage_bounds(specs, [1, 3]) == [0, 2, 7]
    assert stage_bounds(specs, [3, 1]) == [0, 4, 7]
    with pytest.raises(ValueError, match="transformer layers per stage for 4 layers"):
        stage_bounds(specs, [2, 3])


def _cfg(*sets):
    return load_config(TINY, ["parallel.pipeline_parallel_size=2", *sets])


def test_the_counts_reach_the_trainer_only_when_set():
    assert pipeline_stage_layers(_cfg()) is None
    assert pipeline_stage_layers(_cfg("parallel.pipeline_first_stage_layers=1")) == [1, 3]
    assert pipeline_stage_layers(_cfg("parallel.pipeline_last_stage_layers=1")) == [3, 1]
    validate_for_world(_cfg("parallel.pipeline_first_stage_layers=1"), 2)


@pytest.mark.parametrize("sets, field, says", [
    (["parallel.pipeline_first_stage_layers=4"], "parallel.pipeline_first_stage_layers",
     "leave 0 of the 4 layers for 1 other stage"),
    (["parallel.pipeline_first_stage_layers=2", "parallel.pipeline_last_stage_layers=1"],
     "parallel.pipeline_first_stage_layers", "leave 1 of the 4 layers for 0 other stage"),
    (["parallel.pipeline_parallel_size=1", "parallel.pipeline_last_stage_layers=2"],
     "parallel.pipeline_last_stage_layers", "need PP > 1"),
    (["parallel.pipeline_first_stage_layers=1", "parallel.pipeline_partition_method=parameters"],
     "parallel.pipeline_partition_method", "replace the partition method"),
    (["parallel.pipeline_first_stage_layers=2", "parallel.pipeline_schedule=interleaved",
      "parallel.virtual_pipeline_size=2", "training.global_batch_size=16"],
     "parallel.pipeline_first_stage_layers",
     "leave 2 of the 4 layers for 3 other model chunk(s) of the 2 x 2"),
    # the ends counted as a layer (parallel.pipeline_embedding_as_layer, pipeline_loss_as_layer)
    (["parallel.pipeline_embedding_as_layer=true"], "parallel.pipeline_embedding_as_layer",
     "4 layers + 1 counted end(s) = 5 do not split evenly over the 2 stages"),
    (["parallel.pipeline_loss_as_layer=true", "parallel.pipeline_parallel_size=1",
      "model.num_layers=3"], "parallel.pipeline_loss_as_layer", "needs PP > 1"),
    (["parallel.pipeline_embedding_as_layer=true", "parallel.pipeline_loss_as_layer=true",
      "parallel.pipeline_first_stage_layers=1"], "parallel.pipeline_embedding_as_layer",
     "beside set parallel.pipeline_first_stage_layers"),
    (["parallel.pipeline_embedding_as_layer=true", "parallel.pipeline_loss_as_layer=true",
      "parallel.pipeline_partition_method=parameters"], "parallel.pipeline_partition_method",
     "the embedding or the loss counted as a layer, which replace the partition method"),
    # an embedding-only stage under DeepSpeed's engine: one optimizer group where the others
    # hold two, and its gradient norm hangs (measured); model chunks run it
    (["parallel.pipeline_embedding_as_layer=true", "model.num_layers=1"],
     "parallel.pipeline_embedding_as_layer",
     "the first of the 2 stages would hold the embedding alone"),
])
def test_a_bad_split_is_one_message_naming_the_field(sets, field, says):
    cfg = _cfg(*sets)
    world = 2 if cfg.parallel.pipeline_parallel_size == 2 else 1
    with pytest.raises(ConfigError) as err:
        validate_for_world(cfg, world)
    assert err.value.field == field and says in str(err.value), str(err.value)


def test_a_negative_count_is_refused_by_its_section():
    with pytest.raises(ConfigError, match="pipeline_last_stage_layers"):
        _cfg("parallel.pipeline_last_stage_layers=-1")


def test_counting_the_ends_as_layers_follows_megatron_cores_split():
    """Megatron Core's account_for_embedding/loss_in_pipeline_split: the embedding and the head
    each take one layer's place in the even split. Llama 3 405B: 126 layers on 16 stages x 8
    chunks, one layer a chunk, so the first chunk is the embedding alone and the last the head
    and loss alone (arXiv 2407.21783 section 3.3.2)."""
    from megatron.config.stages import accounted_ends, accounted_problem, rank_layers
    assert accounted_ends(126, 128, True, True) == (0, 0)
    assert stage_layers(126, 128, 0, 0) == [0] + [1] * 126 + [0]
    assert rank_layers(126, 16, 8, False, 0, 0) == [7] + [8] * 14 + [7]
    assert accounted_ends(126, 16, True, True) == (7, 7)   # no chunks: the set counts' split
    assert accounted_ends(7, 4, True, False) == (1, None)  # (7 + 1) / 4 = 2, one fewer first
    assert stage_layers(7, 4, 1, None) == [1, 2, 2, 2]
    assert accounted_ends(7, 4, False, True) == (None, 1)
    assert accounted_problem(126, 16, 8, True, True) is None
    assert accounted_problem(6, 2, 1, False, False) is None
    assert "need" in accounted_problem(6, 1, 1, True, True)
    assert "127 do not split evenly over the 128 model chunks of the 16 x 8" in \
        accounted_problem(126, 16, 8, True, False)


def test_end_stages_without_layers_hold_the_embedding_and_the_head_alone():
    specs = _layers(2)  # 0 embedding, 1-2 layers, 3 norm, 4 tied head
    assert stage_bounds(specs, [0, 1, 1, 0]) == [0, 1, 2, 3, 5]
    assert stage_bounds(specs, [0, 2]) == [0, 1, 5]
    assert stage_bounds(specs, [2, 0]) == [0, 3, 5]
    with pytest.raises(ValueError, match="transformer layers per stage"):
        stage_bounds(specs, [1, 0, 1])  # a middle stage must hold a layer


def test_counted_ends_reach_the_trainer():
    cfg = _cfg("parallel.pipeline_embedding_as_layer=true", "parallel.pipeline_loss_as_layer=true",
               "model.num_layers=2", "parallel.pipeline_schedule=interleaved",
               "parallel.virtual_pipeline_size=2", "training.global_batch_size=16")
    validate_for_world(cfg, 2)
    assert pipeline_stage_layers(cfg) == [0, 1, 1, 0]
    one = _cfg("parallel.pipeline_embedding_as_layer=true", "model.num_layers=5")
    validate_for_world(one, 2)
    assert pipeline_stage_layers(one) == [2, 3]


def test_a_rank_holds_its_chunks_layers_in_model_order():
    """rank_layer_indices: chunk c of p x v holds the layers after chunk c - 1's; interleaved
    1F1B's loop gives rank r chunks r, r + p; ZB-V's V chunks r and 2p - 1 - r. rank_layers
    counts them, and one chunk a rank is the contiguous stage."""
    from megatron.config.stages import rank_layer_indices, rank_layers
    assert rank_layer_indices(8, 2, 2) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert rank_layer_indices(8, 2, 2, v_shape=True) == [[0, 1, 6, 7], [2, 3, 4, 5]]
    assert rank_layer_indices(7, 2) == [[0, 1, 2, 3], [4, 5, 6]]
    assert rank_layer_indices(10, 2, 2, first=1, last=3) == [[0, 4, 5, 6], [1, 2, 3, 7, 8, 9]]
    assert rank_layers(10, 2, 2, first=1, last=3) == [4, 6]
