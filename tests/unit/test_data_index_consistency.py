"""The reader checks the pointers against sizes x itemsize and the .bin length: an .idx whose
dtype code disagrees with its data (int32 tokens labelled uint16, say) fails with one message
naming the file and the inconsistency instead of reading in-bounds garbage."""
import struct

import numpy as np
import pytest

from tests.support.data import spec_write, write_tokens
from megatron.config.errors import InputError
from megatron.data.indexed_dataset import IndexedDataset

DOCS = [[1, 2, 3], [4], [5, 6, 7, 8, 9], [10, 11]]
DTYPE_CODE_OFFSET = 17  # 9-byte magic + u64 version


def _relabel(prefix: str, code: int) -> None:
    with open(prefix + ".idx", "r+b") as f:
        f.seek(DTYPE_CODE_OFFSET)
        f.write(struct.pack("<B", code))


def _error(prefix: str) -> str:
    with pytest.raises(InputError) as e:
        IndexedDataset(prefix)
    return str(e.value)


def test_int32_data_labelled_uint16(tmp_path):
    prefix = str(tmp_path / "ds")
    write_tokens(prefix, DOCS, np.int32)
    _relabel(prefix, 8)  # uint16: every sequence still ends inside the .bin
    msg = _error(prefix)
    assert f"index file {prefix}.idx does not match its data (2 bytes per uint16 token" in msg
    assert "sequence 1 starts at byte 12, but the 3 tokens before it take 6 bytes" in msg
    assert "4-byte tokens (float32 or int32)" in msg and "dtype code is probably wrong" in msg
    assert "megatron-preprocess" in msg


def test_one_sequence_mislabelled_is_caught_by_the_bin_length(tmp_path):
    prefix = str(tmp_path / "one")
    write_tokens(prefix, [[1, 2, 3, 4, 5]], np.int32)
    _relabel(prefix, 8)
    msg = _error(prefix)
    assert f"its 5 tokens take 10 bytes, but {prefix}.bin has 20" in msg
    assert "4-byte tokens (float32 or int32)" in msg


def test_uint16_data_labelled_uint8(tmp_path):
    prefix = str(tmp_path / "ds")
    write_tokens(prefix, DOCS, np.uint16)
    _relabel(prefix, 1)
    msg = _error(prefix)
    assert "1 bytes per uint8 token" in msg and "2-byte tokens (int16 or uint16)" in msg


def test_trailing_bytes_in_the_bin(tmp_path):
    prefix = str(tmp_path / "ds")
    write_tokens(prefix, DOCS, np.uint16)
    with open(prefix + ".bin", "ab") as f:
        f.write(b"\0" * 6)
    msg = _error(prefix)
    assert f"its 11 tokens take 22 bytes, but {prefix}.bin has 28" in msg


def test_pointer_gap_between_sequences(tmp_path):
    prefix = str(tmp_path / "ds")
    write_tokens(prefix, DOCS, np.uint16)
    pointers = 34 + 4 * len(DOCS)
    with open(prefix + ".idx", "r+b") as f:  # sequence 2 (at byte 8) claims to start at 10
        f.seek(pointers + 8 * 2)
        f.write(struct.pack("<q", 10))
    assert "sequence 2 starts at byte 10, but the 4 tokens before it take 8 bytes" in \
        _error(prefix)


def test_consistent_files_still_open(tmp_path):
    """Back-to-back sequences, empty documents and an empty dataset are all consistent."""
    prefix = str(tmp_path / "ok")
    spec_write(prefix, 4, [[[1, 2], [3]], [], [[4, 5, 6]], []])
    ds = IndexedDataset(prefix)
    assert [ds[i].tolist() for i in range(len(ds))] == [[1, 2], [3], [4, 5, 6]]
    assert list(ds.document_index) == [0, 2, 2, 3, 3] and ds.num_documents == 4
    write_tokens(str(tmp_path / "none"), [])
    assert len(IndexedDataset(str(tmp_path / "none"))) == 0
