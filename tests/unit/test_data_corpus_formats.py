"""Every input route of megatron-preprocess writes the same .bin/.idx bytes as the JSON-lines
route on the same texts: parquet (several row groups, list columns), zstd JSON lines (several
frames), a folder written by the real `datasets` save_to_disk (a Dataset and a DatasetDict's
split), Arrow streams written by hand in the same format, folders and globs of shards. Formats
are told apart by content (a parquet file named .jsonl still reads as parquet). A truncated or
corrupt parquet, zstd or Arrow file is one InputError naming the file. A failure names the
route that differs."""
import dataclasses
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tests.support.data import documents, spm_model
from megatron.config.errors import InputError
from megatron.data.preprocess import PreprocessJob, preprocess
from megatron.data.readers import expand_inputs, sniff
from megatron.data.tokenizers import TokenizerSpec

def _rows():
    texts = documents(60, seed=3)
    rows = [{"text": t, "title": f"title {i}"} for i, t in enumerate(texts)]
    rows[5]["text"] = ""  # an empty document
    rows[9]["text"] = "   "
    return rows


def _spec():
    return TokenizerSpec("sentencepiece", model=spm_model())


def _encode(tmp_path, inputs, name, keys=("text",), workers=1, split=None):
    job = PreprocessJob([str(p) for p in inputs], str(tmp_path / name), _spec(), keys, True,
                        workers, split=split)
    prefixes, stats = preprocess(job, progress=lambda s: None)
    return prefixes, stats


def _bytes(prefixes):
    out = []
    for p in prefixes:
        for ext in (".bin", ".idx"):
            with open(p + ext, "rb") as f:
                out.append(f.read())
    return out


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    rows = _rows()
    src = _write_jsonl(d / "all.jsonl", rows)
    prefixes, stats = _encode(d, [src], "ref", keys=("text", "title"))
    assert stats.documents == len(rows) and stats.empty >= 1
    return rows, _bytes(prefixes)


def _same(tmp_path, reference, inputs, route, **kw):
    prefixes, _ = _encode(tmp_path, inputs, route, keys=("text", "title"), **kw)
    assert _bytes(prefixes) == reference[1], f"{route}: output differs from the JSON-lines route"


def test_parquet_row_groups_and_workers(tmp_path, reference):
    rows = reference[0]
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=7)  # many row groups
    assert sniff(str(tmp_path / "a.parquet")) == "parquet"
    _same(tmp_path, reference, [tmp_path / "a.parquet"], "parquet")
    _same(tmp_path, reference, [tmp_path / "a.parquet"], "parquet2", workers=2)


def test_parquet_list_column_is_one_sequence_per_element(tmp_path):
    texts = documents(6, seed=4)
    rows = [{"text": t.split("\n")} for t in texts]
    ref, _ = _encode(tmp_path, [_write_jsonl(tmp_path / "l.jsonl", rows)], "lref")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "l.parquet")
    got, _ = _encode(tmp_path, [tmp_path / "l.parquet"], "lpq")
    assert _bytes(got) == _bytes(ref)


def test_zstd_frames_and_content_sniffing(tmp_path, reference):
    rows = reference[0]
    lines = [json.dumps(r) + "\n" for r in rows]
    cctx = zstandard.ZstdCompressor(level=3)
    # Two frames: files concatenated with `cat a.zst b.zst` are one valid zstd stream.
    blob = cctx.compress("".join(lines[:20]).encode()) + cctx.compress("".join(lines[20:]).encode())
    (tmp_path / "c.jsonl.zst").write_bytes(blob)
    _same(tmp_path, reference, [tmp_path / "c.jsonl.zst"], "zstd")
    (tmp_path / "misnamed.jsonl").write_bytes(blob)  # the content, not the name, decides
    assert sniff(str(tmp_path / "misnamed.jsonl")) == "zstd"
    _same(tmp_path, reference, [tmp_path / "misnamed.jsonl"], "zstd_misnamed", workers=2)


def test_folder_and_glob_of_mixed_shards_are_one_corpus(tmp_path, reference):
    rows = reference[0]
    shards = tmp_path / "dump"
    (shards / "sub").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows[:15]), shards / "000_part.parquet")
    _write_jsonl(shards / "001_part.jsonl", rows[15:30])
    cctx = zstandard.ZstdCompressor()
    (shards / "002_part.jsonl.zst").write_bytes(
        cctx.compress("".join(json.dumps(r) + "\n" for r in rows[30:45]).encode()))
    pq.write_table(pa.Table.from_pylist(rows[45:]), shards / "sub" / "003_part.parquet")
    (shards / "README.md").write_text("not data")
    _same(tmp_path, reference, [shards], "folder")
    got = [(os.path.relpath(s.path, shards), s.kind) for s in expand_inputs([str(shards)])]
    assert got == [("000_part.parquet", "parquet"), ("001_part.jsonl", "jsonl"),
                   ("002_part.jsonl.zst", "zstd"), ("sub/003_part.parquet", "parquet")]
    _same(tmp_path, reference, [str(shards / "00*"), str(shards / "sub" / "*.parquet")], "glob")


def test_datasets_save_to_disk_dataset_and_split(tmp_path, reference):
    datasets = pytest.importorskip("datasets", reason="the real datasets package writes the "
                                   "folder; installed by `make setup` (dev extra)")
    rows = reference[0]
    ds = datasets.Dataset.from_list(rows)
    ds.save_to_disk(str(tmp_path / "saved"), num_shards=3)  # three .arrow files in order
    assert len(expand_inputs([str(tmp_path / "saved")])) == 3
    _same(tmp_path, reference, [tmp_path / "saved"], "datasets")
    dd = datasets.DatasetDict({"train": ds, "validation": ds.select(range(3))})
    dd.save_to_disk(str(tmp_path / "dict"))
    _same(tmp_path, reference, [tmp_path / "dict"], "datasets_dict", split="train")
    with pytest.raises(InputError, match="without the split 'test'.*validation"):
        _encode(tmp_path, [tmp_path / "dict"], "nosplit", split="test")
    # a split nothing reads was dropped: a Dataset folder, JSON lines
    for inputs in ([tmp_path / "saved"], [str(tmp_path / "sav*")]):
        with pytest.raises(InputError, match="--split 'train' picks a split of a `datasets` "
                           "DatasetDict folder .* and no --input is one; drop --split"):
            expand_inputs(inputs, "train")
    assert len(expand_inputs([str(tmp_path / "di*")], "validation")) == 1


def test_arrow_stream_written_by_hand(tmp_path, reference):
    """The save_to_disk layout without the datasets package: Arrow IPC streams, state.json."""
    rows = reference[0]
    folder = tmp_path / "hand"
    folder.mkdir()
    names = []
    for i, part in enumerate((rows[:25], rows[25:])):
        name = f"data-{i:05d}-of-00002.arrow"
        table = pa.Table.from_pylist(part)
        with pa.OSFile(str(folder / name), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
            for batch in table.to_batches(max_chunksize=4):
                w.write_batch(batch)
        names.append({"filename": name})
    (folder / "state.json").write_text(json.dumps({"_data_files": names}))
    (folder / "dataset_info.json").write_text("{}")
    _same(tmp_path, reference, [folder], "arrow")


def _corrupt(path, keep):
    data = path.read_bytes()
    # Corrupt: bytes in the middle overwritten (invalid UTF-8 wherever they land in text).
    path.write_bytes(data[:keep] if keep > 0 else data[:len(data) // 2] + b"\xff" * 64
                     + data[len(data) // 2 + 64:])


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_damaged_inputs_name_the_file(tmp_path, reference, damage):
    rows = reference[0]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "x.parquet", row_group_size=10)
    (tmp_path / "x.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        "".join(json.dumps(r) + "\n" for r in rows).encode()))
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(tmp_path / "x.arrow"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        for batch in table.to_batches(max_chunksize=10):
            w.write_batch(batch)
    for name in ("x.parquet", "x.jsonl.zst", "x.arrow"):
        path = tmp_path / name
        _corrupt(path, path.stat().st_size * 2 // 3 if damage == "truncated" else 0)
        with pytest.raises(InputError) as e:
            _encode(tmp_path, [path], "bad")
        assert str(path) in str(e.value), f"{name} ({damage}): {e.value}"
        assert "Traceback" not in str(e.value)


def test_missing_column_and_empty_glob(tmp_path):
    pq.write_table(pa.Table.from_pylist([{"content": "a"}]), tmp_path / "c.parquet")
    with pytest.raises(InputError, match=r"no column 'text' \(columns: content\).*--json-keys"):
        _encode(tmp_path, [tmp_path / "c.parquet"], "nocol")
    with pytest.raises(InputError, match="matches no file"):
        _encode(tmp_path, [str(tmp_path / "nothing-*.parquet")], "noglob")


def test_progress_reports_share_of_input_and_eta(tmp_path, reference):
    rows = reference[0] * 20
    src = _write_jsonl(tmp_path / "big.jsonl", rows)
    seen = []
    job = PreprocessJob([str(src)], str(tmp_path / "p"), _spec(), ("text",), True, 1)
    preprocess(job, progress=lambda s: seen.append(dataclasses.replace(s)), interval=0.0)
    fractions = [s.fraction for s in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert 0 < fractions[len(fractions) // 2] < 1
    bar = seen[-1].bar()
    assert "100%" in bar and "docs" in bar and "tokens" in bar and "MB/s" in bar and "ETA" in bar
    assert np.isclose(seen[-1].eta_s, 0.0)
