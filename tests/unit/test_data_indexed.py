"""MMIDIDX reader and writer: round trips, interoperation with an independent writer/reader
written from the spec, and one clear error per kind of corrupt or mismatched file."""
import os
import struct

import numpy as np
import pytest

from tests.support.data import spec_read, spec_write, write_tokens
from megatron.config.errors import InputError
from megatron.data.indexed_builder import IndexedDatasetBuilder, merge_datasets
from megatron.data.indexed_dataset import IndexedDataset, optimal_token_dtype

DOCS = [[1, 2, 3], [4], [5, 6, 7, 8, 9], [10, 11]]


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int32, np.int64])
def test_builder_then_reader_round_trip(tmp_path, dtype):
    prefix = str(tmp_path / "ds")
    write_tokens(prefix, DOCS, dtype)
    ds = IndexedDataset(prefix)
    assert ds.dtype == np.dtype(dtype)
    assert [ds[i].tolist() for i in range(len(ds))] == DOCS
    assert ds.num_documents == 4 and ds.num_tokens == 11
    assert ds.get(2, 1, 3).tolist() == [6, 7, 8]
    assert list(ds.document_index) == [0, 1, 2, 3, 4]


def test_sequences_are_read_only_views_of_the_mapped_file(tmp_path):
    prefix = str(tmp_path / "ds")
    write_tokens(prefix, DOCS)
    tokens = IndexedDataset(prefix).get(2)
    assert not tokens.flags.owndata and not tokens.flags.writeable


def test_spec_writer_to_project_reader_with_multi_sequence_documents(tmp_path):
    prefix = str(tmp_path / "spec")
    docs = [[[1, 2], [3]], [[4, 5, 6]], [[7], [8], [9, 10]]]
    spec_write(prefix, 4, docs)  # int32
    ds = IndexedDataset(prefix)
    assert ds.dtype == np.int32 and len(ds) == 6 and ds.num_documents == 3
    assert list(ds.document_index) == [0, 2, 3, 6]
    assert [ds[i].tolist() for i in range(6)] == [s for d in docs for s in d]


def test_project_writer_to_spec_reader(tmp_path):
    prefix = str(tmp_path / "ours")
    with IndexedDatasetBuilder(prefix, np.uint16) as b:
        b.add_item([1, 2])
        b.add_item([3])
        b.end_document()
        b.add_document([60000, 5])
    got = spec_read(prefix)
    assert got["version"] == 1 and got["code"] == 8  # uint16
    assert got["sizes"] == [2, 1, 2] and got["pointers"] == [0, 4, 6]
    assert got["doc_index"] == [0, 2, 3]
    assert got["sequences"] == [[1, 2], [3], [60000, 5]]


def test_empty_dataset_round_trip(tmp_path):
    prefix = str(tmp_path / "empty")
    write_tokens(prefix, [])
    ds = IndexedDataset(prefix)
    assert len(ds) == 0 and ds.num_documents == 0 and spec_read(prefix)["doc_index"] == [0]


def test_token_dtype_is_megatron_lms_choice():
    """Megatron-LM's DType.optimal_dtype: uint16 below 65500 ids, else int32, never uint8."""
    assert optimal_token_dtype(200) == np.uint16
    assert optimal_token_dtype(256) == np.uint16
    assert optimal_token_dtype(50257) == np.uint16
    assert optimal_token_dtype(65499) == np.uint16
    assert optimal_token_dtype(65500) == np.int32
    assert optimal_token_dtype(65536) == np.int32
    assert optimal_token_dtype(128256) == np.int32


def test_builder_rejects_ids_beyond_its_dtype_and_leaves_no_files(tmp_path):
    prefix = str(tmp_path / "ds")
    with pytest.raises(InputError, match=r"token id 300 does not fit the uint8"):
        with IndexedDatasetBuilder(prefix, np.uint8) as b:
            b.add_document(np.array([1, 300]))
    assert os.listdir(tmp_path) == []


def test_merge_concatenates_documents(tmp_path):
    a, b, out = (str(tmp_path / n) for n in ("a", "b", "out"))
    write_tokens(a, DOCS[:2])
    spec_write(b, 8, [[[7, 7]], [[8], [9]]])
    assert merge_datasets([a, b], out) == 4
    got = spec_read(out)
    assert got["sequences"] == [[1, 2, 3], [4], [7, 7], [8], [9]]
    assert got["doc_index"] == [0, 1, 2, 3, 5]


def test_merge_refuses_mixed_dtypes(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_tokens(a, DOCS, np.uint16)
    write_tokens(b, DOCS, np.int32)
    with pytest.raises(InputError, match=r"int32.*expected datasets made with one tokenizer"):
        merge_datasets([a, b], str(tmp_path / "out"))


def test_merge_checks_every_input_first_and_names_its_flag(tmp_path):
    """A missing second input was found after the output was started, and the message sent
    the user to a config field (data.paths) a merge has not."""
    a = str(tmp_path / "a")
    write_tokens(a, DOCS)
    with pytest.raises(InputError, match=r"none.idx does not exist: .* prefix '.*none'; fix "
                       r"--inputs, or create them"):
        merge_datasets([a, str(tmp_path / "none")], str(tmp_path / "out"))
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "a.idx"]


# ---- corruption and mismatch: each names the file, the value, what was expected, the fix ----

def _corrupt(tmp_path, edit):
    prefix = str(tmp_path / "ds")
    write_tokens(prefix, DOCS)
    edit(prefix)
    with pytest.raises(InputError) as e:
        IndexedDataset(prefix)
    return prefix, str(e.value)


def _patch(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _truncate(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def test_error_missing_files(tmp_path):
    with pytest.raises(InputError, match=r"nope\.idx does not exist.*megatron-preprocess"):
        IndexedDataset(str(tmp_path / "nope"))
    write_tokens(str(tmp_path / "ds"), DOCS)
    with pytest.raises(InputError, match=r"ds.bin.idx does not exist.*drop the suffix"):
        IndexedDataset(str(tmp_path / "ds.bin"))


def test_error_truncated_header(tmp_path):
    prefix, msg = _corrupt(tmp_path, lambda p: _truncate(p + ".idx", 20))
    assert f"{prefix}.idx is truncated: 20 bytes, expected at least the 34-byte" in msg
    assert "megatron-preprocess" in msg


def test_error_truncated_index_arrays(tmp_path):
    prefix, msg = _corrupt(tmp_path, lambda p: _truncate(p + ".idx", 60))
    assert f"{prefix}.idx is truncated: 60 bytes, expected 122" in msg


def test_error_index_longer_than_header_says(tmp_path):
    def grow(p):
        with open(p + ".idx", "ab") as f:
            f.write(b"\0" * 8)
    prefix, msg = _corrupt(tmp_path, grow)
    assert "is longer than its header says: 130 bytes, expected 122" in msg


def test_error_wrong_magic(tmp_path):
    prefix, msg = _corrupt(tmp_path, lambda p: _patch(p + ".idx", 0, b"TNTIDX\0\0\0"))
    assert f"{prefix}.idx has magic b'TNTIDX" in msg and "expected b'MMIDIDX" in msg


def test_error_wrong_version(tmp_path):
    _, msg = _corrupt(tmp_path, lambda p: _patch(p + ".idx", 9, struct.pack("<Q", 2)))
    assert "format version 2, expected 1" in msg


def test_error_unknown_dtype(tmp_path):
    _, msg = _corrupt(tmp_path, lambda p: _patch(p + ".idx", 17, b"\x09"))
    assert "dtype code 9, expected one of [1, 2, 3, 4, 5, 6, 7, 8]" in msg and "8=uint16" in msg


def test_error_truncated_bin(tmp_path):
    prefix, msg = _corrupt(tmp_path, lambda p: _truncate(p + ".bin", 10))
    assert f"{prefix}.bin is truncated or does not belong to {prefix}.idx" in msg
    assert "sequence 2 ends at byte 18, but the file has 10 bytes" in msg


def test_error_pointer_beyond_bin(tmp_path):
    # sizes: 4 x int32 from byte 34, then pointers; push the last pointer out of the file
    _, msg = _corrupt(tmp_path, lambda p: _patch(p + ".idx", 34 + 16 + 24, struct.pack("<q", 99)))
    assert "sequence 3 ends at byte 103" in msg


def test_error_document_index_inconsistent(tmp_path):
    _, msg = _corrupt(tmp_path, lambda p: _patch(p + ".idx", 34 + 48 + 32, struct.pack("<q", 7)))
    assert "document index from 0 to 7, expected one from 0 to the sequence count 4" in msg


def test_error_token_beyond_vocabulary(tmp_path):
    prefix = str(tmp_path / "ds")
    write_tokens(prefix, [[1, 2], [3, 900, 5]])
    IndexedDataset(prefix, vocab_size=901)  # fits
    with pytest.raises(InputError) as e:
        IndexedDataset(prefix, vocab_size=512)
    msg = str(e.value)
    assert f"{prefix}.bin holds token id 900 (sequence 1)" in msg
    assert "expected ids below the vocabulary size 512" in msg
    assert "data.tokenizer_model" in msg
