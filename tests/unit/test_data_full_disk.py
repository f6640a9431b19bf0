"""A full disk while data files are written (the index cache, megatron-preprocess's .bin/.idx):
one InputError naming the file, 'no space left on device', the bytes needed and free, and no
temporary file or folder left. Simulated with a file whose writes fail; the real full disk (a tmpfs)
is tests/integration/test_data_full_disk_tmpfs.py."""
import errno
import os

import numpy as np
import pytest

from megatron.config.errors import InputError
from megatron.data import index_cache, indexed_builder
from megatron.data.indexed_builder import IndexedDatasetBuilder

ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_an_index_cache_entry_on_a_full_disk_is_one_message_and_no_tmp_folder(tmp_path,
                                                                               monkeypatch):
    def full_save(path, *a, **k):
        open(path, "wb").write(b"\x93NUMPY")  # half an array on disk, then the disk is full
        raise ENOSPC
    monkeypatch.setattr(index_cache.np, "save", full_save)
    arrays = {"doc_idx": np.zeros(1000, np.int64)}
    with pytest.raises(InputError) as e:
        index_cache.load_or_build(str(tmp_path), "entry", ["doc_idx"], lambda: arrays)
    msg = str(e.value)
    assert msg.startswith(str(tmp_path / "entry")) and "no space left on device" in msg, msg
    assert "data index cache (needs at least 8,000 bytes" in msg and "bytes free" in msg, msg
    assert not [n for n in os.listdir(tmp_path) if n.startswith("entry")]


class FullBin:
    """The .bin of a disk that fills after `room` bytes."""

    def __init__(self, real, room):
        self.real, self.room = real, room

    def write(self, b):
        if self.real.tell() + len(b) > self.room:
            self.real.write(b[:self.room - self.real.tell()])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.real.write(b)

    def close(self):
        self.real.close()


def test_a_dataset_whose_tokens_fill_the_disk_leaves_no_tmp_files(tmp_path):
    prefix = str(tmp_path / "corpus_text_document")
    with pytest.raises(InputError) as e:
        with IndexedDatasetBuilder(prefix, np.uint16) as b:
            b._bin = FullBin(b._bin, 1000)
            for _ in range(10):
                b.add_document(np.arange(100))  # 200 bytes each
    msg = str(e.value)
    assert msg.startswith(prefix + ".bin: no space left on device while writing the dataset's "
                          "tokens"), msg
    assert "needs at least 1,200 bytes" in msg and "bytes free" in msg, msg
    assert os.listdir(tmp_path) == []


def test_a_full_disk_at_the_index_file_leaves_neither_file(tmp_path, monkeypatch):
    prefix = str(tmp_path / "corpus_text_document")

    def full_index(path, *a):
        open(path, "wb").write(b"MMIDIDX")
        raise ENOSPC
    monkeypatch.setattr(indexed_builder, "write_index", full_index)
    with pytest.raises(InputError, match=r"corpus_text_document\.idx: no space left on device "
                                         r"while writing the dataset's index \(needs 62 bytes, "):
        with IndexedDatasetBuilder(prefix, np.uint16) as b:
            b.add_document(np.arange(10))
    assert os.listdir(tmp_path) == []


def test_another_os_error_stays_itself(tmp_path):
    with pytest.raises(PermissionError):
        with IndexedDatasetBuilder(str(tmp_path / "c"), np.uint16) as b:
            b._bin = FullBin(b._bin, 10)
            b._bin.write = lambda data: (_ for _ in ()).throw(PermissionError(errno.EACCES, "no"))
            b.add_document(np.arange(10))
    assert os.listdir(tmp_path) == []
