"""Writer of the MMIDIDX format (see indexed_dataset.py for the layout).

Both files are written under temporary names in the destination directory and renamed into place
by `finalize`, so a reader never sees a half-written dataset and a crash leaves no file under the
final names. The .bin is renamed before the .idx: a present .idx means a complete pair. A full disk
(ENOSPC, or EDQUOT for a quota) removes the temporary files and is one InputError naming the file,
the bytes it needed at least and the bytes free."""
from __future__ import annotations

import array
import os
import uuid
from typing import Iterable, Optional, Sequence

import numpy as np

from megatron.config.errors import InputError, disk_full
from megatron.data.indexed_dataset import HEADER_SIZE, MAGIC, VERSION, IndexedDataset, \
    dtype_code

_INT32_MAX = (1 << 31) - 1


class IndexedDatasetBuilder:
    """Append documents (`add_document`) or sequences grouped by `end_document`, then
    `finalize`. Usable as a context manager: an exception removes the temporary files."""

    def __init__(self, prefix: str, dtype):
        self.prefix = prefix
        self.dtype = np.dtype(dtype)
        self._code = dtype_code(self.dtype)
        parent = os.path.dirname(os.path.abspath(prefix))
        os.makedirs(parent, exist_ok=True)
        tag = f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._tmp_bin, self._tmp_idx = prefix + ".bin" + tag, prefix + ".idx" + tag
        self._bin = open(self._tmp_bin, "wb")
        # array.array keeps 4 or 8 bytes a sequence; a Python list would need ~36.
        self._sizes = array.array("i")
        self._doc_index = array.array("q", [0])
        self._done = False

    def __enter__(self) -> "IndexedDatasetBuilder":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._done:
            self.finalize()

    @property
    def num_sequences(self) -> int:
        return len(self._sizes)

    def add_item(self, tokens) -> None:
        """One sequence of the current document."""
        arr = self._as_dtype(tokens)
        if len(arr) > _INT32_MAX:
            raise InputError(f"a sequence of {len(arr)} tokens for {self.prefix} exceeds the "
                             f"int32 size field of the MMIDIDX index; split the document")
        self._write(arr.tobytes(order="C"))
        self._sizes.append(len(arr))

    def _write(self, data: bytes) -> None:
        try:
            self._bin.write(data)
        except OSError as e:
            self._fail(e, self._tmp_bin, "the dataset's tokens", len(data))

    def _fail(self, error: OSError, path: str, what: str, pending: int) -> None:
        """Removes the temporary files; a full disk becomes the one-line InputError. `pending`:
        the bytes of the write that failed, beyond what the file already holds."""
        tokens = sum(self._sizes) * self.dtype.itemsize  # what the .bin holds before `pending`
        needed = tokens + pending if path == self._tmp_bin else pending
        self.abort()
        final = self.prefix + (".bin" if path == self._tmp_bin else ".idx")  # not the tmp name
        full = disk_full(final, what, error, needed, at_least=path == self._tmp_bin)
        if full is None:
            raise error
        raise full from None

    def end_document(self) -> None:
        self._doc_index.append(len(self._sizes))

    def add_document(self, tokens, lengths: Optional[Sequence[int]] = None) -> None:
        """One document: a single sequence, or (Megatron-LM's add_document) the concatenated
        sequences of the given lengths. Empty `lengths` makes an empty document: no sequence,
        only a document-index entry, as Megatron-LM writes a text with no tokens."""
        if lengths is None:
            self.add_item(tokens)
        else:
            arr = self._as_dtype(tokens)
            if sum(lengths) != len(arr) or any(n <= 0 for n in lengths):
                raise ValueError(f"sequence lengths {list(lengths)[:8]} do not split the "
                                 f"document's {len(arr)} tokens into non-empty sequences")
            start = 0
            for n in lengths:
                self.add_item(arr[start:start + n])
                start += n
        self.end_document()

    def _as_dtype(self, tokens) -> np.ndarray:
        arr = np.asarray(tokens)
        if arr.dtype == self.dtype:
            return arr.reshape(-1)
        arr = arr.reshape(-1)
        if len(arr) and self.dtype.kind in "iu":
            info = np.iinfo(self.dtype)
            lo, hi = int(arr.min()), int(arr.max())
            if lo < info.min or hi > info.max:
                raise InputError(f"token id {hi if hi > info.max else lo} does not fit the "
                                 f"{self.dtype} tokens of {self.prefix} (range {info.min}.."
                                 f"{info.max}); the tokenizer's vocabulary is larger than the one "
                                 f"the dtype was chosen for")
        return arr.astype(self.dtype)

    def merge(self, prefix: str, named_by: str = "data.paths") -> None:
        """Append every document of another dataset of the same dtype."""
        other = IndexedDataset(prefix, named_by=named_by)
        if other.dtype != self.dtype:
            raise InputError(f"cannot merge {prefix} (tokens of {other.dtype}) into "
                             f"{self.prefix} ({self.dtype}): expected datasets made with one "
                             f"tokenizer; preprocess them again with the same tokenizer")
        base = len(self._sizes)
        # The reader checked that the sequences fill its .bin back to back: copy it whole.
        with open(other.bin_path, "rb") as src:
            _copy_bytes(src, self._write, other.num_tokens * self.dtype.itemsize)
        self._sizes.frombytes(np.ascontiguousarray(other.sizes, np.int32).tobytes())
        self._doc_index.frombytes((other.document_index[1:] + base).astype(np.int64).tobytes())

    def finalize(self) -> None:
        sizes = np.frombuffer(self._sizes, dtype=np.int32) if len(self._sizes) \
            else np.zeros(0, np.int32)
        doc_index = np.frombuffer(self._doc_index, dtype=np.int64)
        try:
            self._bin.close()  # flushes the last of the tokens
        except OSError as e:
            self._fail(e, self._tmp_bin, "the dataset's tokens", 0)
        try:
            write_index(self._tmp_idx, self.dtype, sizes, doc_index)
        except OSError as e:
            self._fail(e, self._tmp_idx, "the dataset's index",
                       index_bytes(len(sizes), len(doc_index)))
        os.replace(self._tmp_bin, self.prefix + ".bin")
        os.replace(self._tmp_idx, self.prefix + ".idx")
        self._done = True

    def abort(self) -> None:
        try:
            self._bin.close()
        except OSError:  # the buffer's last flush failed (a full disk): the file goes anyway
            pass
        for path in (self._tmp_bin, self._tmp_idx):
            if os.path.exists(path):
                os.remove(path)
        self._done = True


def write_index(path: str, dtype, sizes: np.ndarray, doc_index: np.ndarray) -> None:
    """The .idx for contiguous sequences: pointers are the running byte offsets."""
    dtype = np.dtype(dtype)
    sizes = np.ascontiguousarray(sizes, dtype=np.int32)
    pointers = np.zeros(len(sizes), dtype=np.int64)
    if len(sizes) > 1:
        np.cumsum(sizes[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
    doc_index = np.ascontiguousarray(doc_index, dtype=np.int64)
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(np.array([VERSION], "<u8").tobytes())
        f.write(np.array([dtype_code(dtype)], "<u1").tobytes())
        f.write(np.array([len(sizes), len(doc_index)], "<u8").tobytes())
        f.write(sizes.astype("<i4").tobytes())
        f.write(pointers.astype("<i8").tobytes())
        f.write(doc_index.astype("<i8").tobytes())
    assert os.path.getsize(path) == index_bytes(len(sizes), len(doc_index))


def index_bytes(sequences: int, documents: int) -> int:
    """The size of an .idx: the header, then sizes (4 bytes) and pointers (8) per sequence and
    one 8-byte document-index entry per document boundary."""
    return HEADER_SIZE + 12 * sequences + 8 * documents


def _copy_bytes(src, write, count: int) -> None:
    """Copy the first `count` bytes of src to `write` in chunks of at most 16 MiB."""
    remaining = count
    while remaining:
        chunk = src.read(min(remaining, 1 << 24))
        if not chunk:
            break
        write(chunk)
        remaining -= len(chunk)


def merge_datasets(prefixes: Iterable[str], output_prefix: str) -> int:
    """Concatenate datasets (documents in the given order) into one; returns the document count."""
    prefixes = list(prefixes)
    if not prefixes:
        raise InputError("merge needs at least one input prefix, got none")
    # every input opened (and checked) before the output is started
    first = [IndexedDataset(prefix, named_by="--inputs") for prefix in prefixes][0]
    with IndexedDatasetBuilder(output_prefix, first.dtype) as builder:
        for prefix in prefixes:
            builder.merge(prefix, named_by="--inputs")
        documents = len(builder._doc_index) - 1
    return documents


__all__ = ["IndexedDatasetBuilder", "merge_datasets", "write_index"]
