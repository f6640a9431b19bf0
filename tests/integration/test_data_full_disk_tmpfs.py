"""A real full disk under megatron-preprocess's writer: a 256 KiB tmpfs that 400 KB of tokens
overflow gives one InputError naming the .bin, the bytes needed and free, and leaves no file.
Mounting needs root or CAP_SYS_ADMIN (CI's VM runs as root); skipped with the reason otherwise.
The simulated full disks are tests/unit/test_data_full_disk.py."""
import os

import numpy as np
import pytest

from megatron.config.errors import InputError
from megatron.data.indexed_builder import IndexedDatasetBuilder
from tests.support.disks import tmpfs

def test_a_real_full_disk_during_preprocessing(tmp_path):
    with tmpfs(tmp_path / "disk", "256k") as mnt:
        prefix = str(mnt / "corpus_text_document")
        with pytest.raises(InputError, match=r"corpus_text_document\.bin: no space left on "
                                             r"device while writing the dataset's tokens \(needs "
                                             r"at least [\d,]+ bytes, [\d,]+ bytes free\)"):
            with IndexedDatasetBuilder(prefix, np.uint16) as b:
                for _ in range(200):
                    b.add_document(np.arange(1000))  # 400 KB in all
        assert os.listdir(mnt) == []
