"""A truncated input is never read short without a word (issue 41 item 5): every corpus format
cut exactly at one of its own boundaries (between two Arrow record batches, before a parquet
row group, between two zstd frames or gzip members) and cut mid-way is one InputError naming the
file, from megatron-preprocess's library call. A failure names the format and the cut. What
cannot be told from a complete file is not tested: a JSON-lines file cut after a newline, a zstd
or gzip file cut between frames that end at a newline. As a process:
tests/integration/test_data_corpus_formats_cli.py."""
import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from megatron.config.errors import InputError
from megatron.data.preprocess import PreprocessJob, preprocess
from megatron.data.tokenizers import TokenizerSpec

ROWS = [{"text": " ".join(str((i * 7 + j) % 97) for j in range(5 + i % 30))} for i in range(300)]
TEXT = "".join(json.dumps(r) + "\n" for r in ROWS).encode()


def _arrow(path, writer):
    """An Arrow IPC stream or file of 100-row batches; the offsets where each batch ends."""
    table, ends = pa.Table.from_pylist(ROWS), []
    with pa.OSFile(str(path), "wb") as f, writer(f, table.schema) as w:
        for batch in table.to_batches(max_chunksize=100):
            w.write_batch(batch)
            ends.append(f.tell())
    return ends[:-1]


def _parquet(path):
    pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=100)
    meta = pq.ParquetFile(path).metadata
    # a row group starts where its first column chunk's pages do
    return [meta.row_group(i).column(0).data_page_offset for i in range(1, meta.num_row_groups)]


def _frames(path, compress):
    """Three frames (members) split inside a line, as parallel compressors split their input."""
    parts = [TEXT[:len(TEXT) // 3], TEXT[len(TEXT) // 3:2 * len(TEXT) // 3],
             TEXT[2 * len(TEXT) // 3:]]
    blobs = [compress(p) for p in parts]
    path.write_bytes(b"".join(blobs))
    return [len(blobs[0]), len(blobs[0]) + len(blobs[1])]


WRITERS = {
    "x.arrow": lambda p: _arrow(p, pa.ipc.new_stream),
    "x_file.arrow": lambda p: _arrow(p, pa.ipc.new_file),
    "x.parquet": _parquet,
    "x.jsonl.zst": lambda p: _frames(p, zstandard.ZstdCompressor().compress),
    "x.jsonl.gz": lambda p: _frames(p, gzip.compress),
}


def _preprocess(tmp_path, path):
    job = PreprocessJob([str(path)], str(tmp_path / "out"), TokenizerSpec("null", vocab_size=100),
                        ("text",), True, 1)
    return preprocess(job, progress=lambda s: None)[1]


def _refused(tmp_path, path, cut):
    data = path.read_bytes()
    path.write_bytes(data[:cut])
    with pytest.raises(InputError) as e:
        _preprocess(tmp_path, path)
    assert str(path) in str(e.value), e.value
    assert "truncated" in str(e.value) or "cannot be read" in str(e.value), e.value


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_whole_files_read_every_document(tmp_path, name):
    WRITERS[name](tmp_path / name)
    assert _preprocess(tmp_path, tmp_path / name).documents == len(ROWS)


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_file_cut_at_its_own_boundary_is_refused_naming_it(tmp_path, name):
    boundary = WRITERS[name](tmp_path / name)[-1]
    _refused(tmp_path, tmp_path / name, boundary)


@pytest.mark.parametrize("name", sorted(WRITERS) + ["x.jsonl"])
def test_a_file_cut_mid_way_is_refused_naming_it(tmp_path, name):
    path = tmp_path / name
    if name == "x.jsonl":
        path.write_bytes(TEXT)
    else:
        WRITERS[name](path)
    _refused(tmp_path, path, path.stat().st_size // 2 + 3)


def test_gzip_without_its_trailer_is_refused(tmp_path):
    path = tmp_path / "x.jsonl.gz"
    path.write_bytes(gzip.compress(TEXT))
    _refused(tmp_path, path, path.stat().st_size - 8)  # CRC32 and size


def test_a_cut_json_line_names_file_and_line_and_a_whole_last_line_is_kept(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(TEXT[:-12])
    with pytest.raises(InputError, match=rf"{path}:{len(ROWS)} is cut.*truncated"):
        _preprocess(tmp_path, path)
    path.write_bytes(TEXT[:-1])  # only the final newline left out: every document is there
    assert _preprocess(tmp_path, path).documents == len(ROWS)
