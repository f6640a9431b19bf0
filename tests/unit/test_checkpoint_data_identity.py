"""A checkpoint's data stream is known by content, not by path (issue 41 item 9): the same
.bin/.idx copied elsewhere resume at the checkpoint's position with an info line; other contents
are refused with both ways on offered (training.new_data_stream, training.keep_data_position);
a record written before fingerprints compares paths as before. A failure names the comparison
(checkpoint/layout.py stream_changes, check_data) or the record (base/records.DataRecord).
As a process: tests/integration/test_checkpoint_data_stream.py."""
import dataclasses
import logging
import shutil
from types import SimpleNamespace

import pytest

from megatron.base.records import DataRecord
from megatron.checkpoint.layout import Resume, check_data, data_record
from megatron.config import ConfigError, load_config
from megatron.config.errors import InputError

from tests.support.paths import TINY


def corpus(folder, docs=b"\x01\x02\x03\x04" * 8):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "c.bin").write_bytes(docs)
    (folder / "c.idx").write_bytes(b"MMIDIDX\x00\x00" + bytes([len(docs)]) * 16)
    return str(folder / "c")


def record(prefix, *sets):
    cfg = load_config(TINY, ["data.synthetic=false", f"data.paths=[{prefix}]", *sets])
    return data_record(cfg)


def resume_of(saved: DataRecord, consumed=96):
    return Resume("run/checkpoints/step_12", 12, SimpleNamespace(data=saved,
                                                                 consumed_samples=consumed))


def test_the_same_files_elsewhere_continue_at_the_position_with_an_info_line(tmp_path, caplog):
    saved = record(corpus(tmp_path / "old"))
    shutil.copytree(tmp_path / "old", tmp_path / "moved")
    moved = record(str(tmp_path / "moved" / "c"))
    assert saved.paths != moved.paths and saved.fingerprints == moved.fingerprints
    with caplog.at_level(logging.INFO):
        assert check_data(resume_of(saved), moved, new_stream=False) is False
    assert "the same files (by content) are now at" in caplog.text


def test_other_contents_are_refused_offering_both_ways_on(tmp_path):
    saved = record(corpus(tmp_path / "a"))
    for current in (record(corpus(tmp_path / "b", b"\x09" * 40)),  # elsewhere, other contents
                    record(corpus(tmp_path / "a", b"\x09" * 40))):  # rebuilt in place
        with pytest.raises(InputError) as e:
            check_data(resume_of(saved), current, new_stream=False)
        for fragment in ("data.paths: the files' contents differ", "consumed_samples=96",
                         "checkpoint.new_data_stream=true",
                         "checkpoint.keep_data_position=true"):
            assert fragment in str(e.value), (fragment, str(e.value))


def test_keep_data_position_continues_and_new_data_stream_starts_afresh(tmp_path, caplog):
    saved = record(corpus(tmp_path / "a"))
    current = record(corpus(tmp_path / "b", b"\x09" * 40))
    with caplog.at_level(logging.WARNING):
        assert check_data(resume_of(saved), current, False, keep_position=True) is False
    assert "keep_data_position=true" in caplog.text and "consumed_samples=96" in caplog.text
    assert check_data(resume_of(saved), current, new_stream=True) is True
    with pytest.raises(ConfigError, match="checkpoint.keep_data_position"):
        load_config(TINY, ["training.new_data_stream=true", "training.keep_data_position=true"])


def test_a_record_without_fingerprints_compares_paths_as_before(tmp_path):
    old_json = dataclasses.asdict(record(corpus(tmp_path / "old")))
    del old_json["fingerprints"]  # what a checkpoint before this change holds
    saved = DataRecord.from_json(old_json)
    assert saved.fingerprints is None
    assert check_data(resume_of(saved), record(str(tmp_path / "old" / "c")), False) is False
    shutil.copytree(tmp_path / "old", tmp_path / "moved")
    with pytest.raises(InputError, match="data.paths: checkpoint"):
        check_data(resume_of(saved), record(str(tmp_path / "moved" / "c")), False)


def test_the_record_keeps_its_fingerprints_and_other_fields_still_count(tmp_path):
    prefix = corpus(tmp_path / "a")
    saved = record(prefix)
    assert DataRecord.from_json(dataclasses.asdict(saved)) == saved
    assert saved.fingerprints[0].startswith("bin 32 idx 25 blake2b ")
    with pytest.raises(InputError, match="data.seed: checkpoint 1234, this run 7"):
        check_data(resume_of(saved), record(prefix, "data.seed=7"), False)
