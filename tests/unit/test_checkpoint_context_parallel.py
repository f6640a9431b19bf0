"""The context-parallel degree in a checkpoint's layout record (and the expert-parallel one, the
same way): written when it is not 1, read back, and absent (1) in every checkpoint written
without it; and the random streams a resumed rank reads come from a shard file the old layout
wrote."""
from types import SimpleNamespace

import pytest

from megatron.checkpoint import sharded
from megatron.checkpoint.layout import layout_record
from megatron.base.records import LayoutRecord
from megatron.config import load_config
from megatron.parallel.state import RankCoord
from tests.support.paths import TINY


def test_the_degree_round_trips_and_one_is_left_out_on_disk():
    cfg = load_config(TINY, ["parallel.context_parallel_size=2"])
    record = layout_record(cfg, 1, 512, 512)
    assert record.to_json()["context_parallel_size"] == 2
    assert LayoutRecord.from_json(record.to_json()) == record
    assert "CP2" in record.text()
    plain = layout_record(load_config(TINY, []), 2, 512, 512)
    assert "context_parallel_size" not in plain.to_json()
    assert LayoutRecord.from_json(plain.to_json()).context_parallel_size == 1


def test_the_expert_parallel_degree_is_recorded_as_context_parallels_is():
    """parallel.expert_parallel_size in the layout record: written when it is not 1 (for the
    resume's 'written by ..., continued as ...' line), absent at 1 and read back as 1 from a
    checkpoint written without it."""
    cfg = load_config(TINY, ["model.moe.num_experts=4", "parallel.expert_parallel_size=2"])
    record = layout_record(cfg, 2, 512, 512)
    assert record.to_json()["expert_parallel_size"] == 2
    assert LayoutRecord.from_json(record.to_json()) == record
    assert record.text() == "TP1 PP1 DP2 EP2 ZeRO-1"
    plain = layout_record(load_config(TINY, ["model.moe.num_experts=4"]), 2, 512, 512)
    assert "expert_parallel_size" not in plain.to_json() and "EP" not in plain.text()
    assert LayoutRecord.from_json(plain.to_json()).expert_parallel_size == 1
    bad = dict(record.to_json(), expert_parallel_size="2")
    with pytest.raises(Exception, match="expert_parallel_size is '2', expected"):
        LayoutRecord.from_json(bad)


class _Files:
    """A checkpoint's shard files as a Reader sees them: each file's "rng" is its own name."""

    def file(self, rel):
        return {"rng": rel}


def _layout(dp, cp):
    return LayoutRecord(tensor_parallel_size=2, pipeline_parallel_size=1, data_parallel_size=dp,
                        zero_stage=1, padded_vocab_size=512, vocab_size=512, model={},
                        context_parallel_size=cp)


@pytest.mark.parametrize("old_dp, old_cp, shard, expected", [
    (1, 2, 1, 1),  # same layout with context parallelism: its own file, not dp_cp 0's
    (2, 2, 3, 3),
    (2, 1, 3, 1),  # more ZeRO shards now than then: the old group's last file
    (1, 4, 2, 2),  # context ranks then, data ranks now: still a file the old layout wrote
    (4, 1, 0, 0)])
def test_the_rng_comes_from_a_file_of_the_old_dp_cp_group(old_dp, old_cp, shard, expected):
    meta = SimpleNamespace(layout=_layout(old_dp, old_cp))
    rs = SimpleNamespace(coords=RankCoord(tp=1, pp=0, dp_cp=shard))
    got = sharded._rng_for(_Files(), meta, rs, tp=2, pp=1)
    assert got == sharded.shard_file(RankCoord(tp=1, pp=0, dp_cp=expected))


def test_a_changed_tensor_or_pipeline_size_rederives_the_streams():
    meta = SimpleNamespace(layout=_layout(2, 1))
    rs = SimpleNamespace(coords=RankCoord(0, 0, 0))
    assert sharded._rng_for(_Files(), meta, rs, tp=1, pp=1) is None
