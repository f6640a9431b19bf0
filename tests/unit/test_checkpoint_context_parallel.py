"""The context-parallel degree in a checkpoint's layout record: written when it is not 1, read
back, and absent (1) in every checkpoint written without it."""
from megatron.checkpoint.layout import layout_record
from megatron.checkpoint.records import LayoutRecord
from megatron.config import load_config
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
