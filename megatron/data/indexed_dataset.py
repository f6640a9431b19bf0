"""Reader of the MMIDIDX format shared by Megatron-LM, Megatron-DeepSpeed and GPT-NeoX.

PREFIX.idx: 9-byte magic, u64 version (1), u8 dtype code, u64 sequence count n, u64 document
count d, then int32 sizes[n], int64 byte pointers[n] into PREFIX.bin, int64 document index[d].
The document index holds the first sequence of every document plus a final entry n, so it starts
at 0 and d = documents + 1. PREFIX.bin is the token arrays back to back.

Both files are memory-mapped and every sequence is a zero-copy view. The header, the sizes and the
pointers are checked against the file lengths when the dataset is opened (the sequences lie back
to back: pointers are running sums of sizes x itemsize, and the .bin ends with the last one), so a
truncated, foreign or mislabelled file fails here with a message rather than as garbage tokens or
a segfault deep in training."""
from __future__ import annotations

import os
import struct
from typing import Optional

import numpy as np

from megatron.config.errors import InputError, unexpanded

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, documents
HEADER_SIZE = _HEADER.size  # 34 bytes

DTYPE_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
               6: np.float64, 7: np.float32, 8: np.uint16}
CODE_OF_DTYPE = {np.dtype(v): k for k, v in DTYPE_CODES.items()}

# Checks over the sizes and pointers run in blocks so a 100M-sequence index needs no big temporary.
_CHECK_BLOCK = 1 << 22

_REPREPROCESS = "re-run megatron-preprocess to write PREFIX.bin and PREFIX.idx again"


def optimal_token_dtype(vocab_size: int) -> np.dtype:
    """Megatron-LM's choice (DType.optimal_dtype): uint16 below 65500 ids, else int32, never
    uint8, so our preprocessing writes the same bytes as tools/preprocess_data.py."""
    return np.dtype(np.uint16) if vocab_size < 65500 else np.dtype(np.int32)


def dtype_code(dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype not in CODE_OF_DTYPE:
        raise InputError(f"token dtype {dtype} has no MMIDIDX code: expected one of "
                         f"{', '.join(str(np.dtype(d)) for d in DTYPE_CODES.values())}")
    return CODE_OF_DTYPE[dtype]


def _map(path: str) -> np.ndarray:
    """A read-only byte view of the whole file; numpy cannot memory-map an empty file."""
    if os.path.getsize(path) == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r")


class IndexedDataset:
    """Sequences of one PREFIX.bin/.idx pair. `vocab_size`, when given, makes `check_token_ids`
    part of opening (a full scan of the .bin)."""

    def __init__(self, prefix: str, vocab_size: Optional[int] = None,
                 named_by: str = "data.paths"):
        """named_by: where the prefix was given (a config field, a command-line flag), the fix
        a missing file's message names."""
        self.prefix = prefix
        self.idx_path, self.bin_path = prefix + ".idx", prefix + ".bin"
        for path in (self.idx_path, self.bin_path):
            if not os.path.isfile(path):
                hint = (" (drop the suffix: a prefix names both files)"
                        if prefix.endswith((".bin", ".idx")) else "")
                raise InputError(
                    f"data file {path} does not exist{unexpanded(path)}: expected PREFIX.bin "
                    f"and PREFIX.idx for "
                    f"prefix {prefix!r}{hint}; fix {named_by}, or create them with "
                    f"megatron-preprocess")
        self._idx = _map(self.idx_path)
        self._read_header()
        self._bin = _map(self.bin_path)
        self._check_pointers()
        if vocab_size is not None:
            self.check_token_ids(vocab_size)

    # ---- opening and validation -------------------------------------------------------------

    def _read_header(self) -> None:
        idx_len = len(self._idx)
        if idx_len < HEADER_SIZE:
            raise InputError(f"index file {self.idx_path} is truncated: {idx_len} bytes, expected "
                             f"at least the {HEADER_SIZE}-byte MMIDIDX header; {_REPREPROCESS}")
        magic, version, code, n, d = _HEADER.unpack(bytes(self._idx[:HEADER_SIZE]))
        if magic != MAGIC:
            raise InputError(f"index file {self.idx_path} has magic {magic!r}, expected {MAGIC!r} "
                             f"(the Megatron MMIDIDX format); it is not a Megatron mmap index, "
                             f"{_REPREPROCESS}")
        if version != VERSION:
            raise InputError(f"index file {self.idx_path} has format version {version}, expected "
                             f"{VERSION}; {_REPREPROCESS}")
        if code not in DTYPE_CODES:
            raise InputError(f"index file {self.idx_path} has dtype code {code}, expected one of "
                             f"{sorted(DTYPE_CODES)} ({_codes_text()}); {_REPREPROCESS}")
        self.dtype = np.dtype(DTYPE_CODES[code])
        expected = HEADER_SIZE + 12 * n + 8 * d
        if idx_len != expected:
            what = "truncated" if idx_len < expected else "longer than its header says"
            raise InputError(f"index file {self.idx_path} is {what}: {idx_len} bytes, expected "
                             f"{expected} for {n} sequences and {d} document-index entries; "
                             f"{_REPREPROCESS}")
        self.sizes = np.frombuffer(self._idx, np.int32, n, HEADER_SIZE)
        self.pointers = np.frombuffer(self._idx, np.int64, n, HEADER_SIZE + 4 * n)
        self.document_index = np.frombuffer(self._idx, np.int64, d, HEADER_SIZE + 12 * n)
        self._check_document_index(n)

    def _check_document_index(self, n: int) -> None:
        doc = self.document_index
        if len(doc) == 0 or doc[0] != 0 or doc[-1] != n:
            first = int(doc[0]) if len(doc) else None
            last = int(doc[-1]) if len(doc) else None
            raise InputError(f"index file {self.idx_path} has a document index from {first} to "
                             f"{last}, expected one from 0 to the sequence count {n}; "
                             f"{_REPREPROCESS}")
        if len(doc) > 1 and np.any(np.diff(doc) < 0):
            raise InputError(f"index file {self.idx_path} has a decreasing document index, "
                             f"expected non-decreasing sequence numbers; {_REPREPROCESS}")

    def _check_pointers(self) -> None:
        """Every MMIDIDX writer (Megatron-LM, Megatron-DeepSpeed, GPT-NeoX, ours) stores the
        sequences back to back: pointer i is the byte size of sequences 0..i-1, and the .bin ends
        with the last one. Checking exactly that catches a dtype code that disagrees with the
        data (int32 tokens labelled uint16 would otherwise read in-bounds garbage)."""
        bin_len, item = len(self._bin), self.dtype.itemsize
        offset = 0  # byte where the next sequence must start
        for lo in range(0, len(self.sizes), _CHECK_BLOCK):
            sizes = self.sizes[lo:lo + _CHECK_BLOCK].astype(np.int64)
            ptrs = self.pointers[lo:lo + _CHECK_BLOCK]
            if len(sizes) and (sizes.min() < 0 or ptrs.min() < 0):
                i = lo + int(np.argmin(np.minimum(sizes, ptrs)))
                raise InputError(f"index file {self.idx_path} has a negative size or pointer at "
                                 f"sequence {i} (size {self.sizes[i]}, pointer {self.pointers[i]})"
                                 f", expected non-negative values; {_REPREPROCESS}")
            ends = ptrs + sizes * item
            if len(ends) and ends.max() > bin_len:
                i = lo + int(np.argmax(ends > bin_len))
                raise InputError(
                    f"data file {self.bin_path} is truncated or does not belong to "
                    f"{self.idx_path}: sequence {i} ends at byte {int(ends[i - lo])}, but the file "
                    f"has {bin_len} bytes; {_REPREPROCESS}")
            starts = offset + np.concatenate(([0], np.cumsum(sizes[:-1] * item)))
            if len(sizes) and not np.array_equal(ptrs, starts):
                i = int(np.argmax(ptrs != starts))
                self._raise_layout(f"sequence {lo + i} starts at byte {int(ptrs[i])}, but the "
                                   f"{int(starts[i]) // item} tokens before it take "
                                   f"{int(starts[i])} bytes", int(ptrs[i]), int(starts[i]) // item)
            if len(sizes):
                offset = int(ends[-1])
        if offset != bin_len:
            self._raise_layout(f"its {offset // item} tokens take {offset} bytes, but "
                               f"{self.bin_path} has {bin_len}", bin_len, offset // item)

    def _raise_layout(self, what: str, nbytes: int, tokens: int):
        """The pointers or the .bin length disagree with sizes x itemsize; name the dtype the
        bytes would fit, which is the usual cause (a wrong dtype code)."""
        item = self.dtype.itemsize
        guess = ""
        if tokens and nbytes % tokens == 0 and nbytes // tokens != item:
            fits = sorted({str(np.dtype(d)) for d in DTYPE_CODES.values()
                           if np.dtype(d).itemsize == nbytes // tokens})
            if fits:
                guess = (f"; the bytes fit {nbytes // tokens}-byte tokens ({' or '.join(fits)}), "
                         f"so the dtype code is probably wrong")
        raise InputError(f"index file {self.idx_path} does not match its data ({item} bytes "
                         f"per {self.dtype} token, sizes x itemsize): {what}{guess}; "
                         f"{_REPREPROCESS}")

    def check_token_ids(self, vocab_size: int) -> None:
        """Fails when a token id is outside [0, vocab_size): the data was tokenized with another
        vocabulary than the one configured."""
        tokens = np.frombuffer(self._bin, self.dtype, len(self._bin) // self.dtype.itemsize)
        block = 1 << 24
        for lo in range(0, len(tokens), block):
            chunk = tokens[lo:lo + block]
            bad = np.flatnonzero((chunk >= vocab_size) | (chunk < 0))
            if len(bad):
                pos = (lo + int(bad[0])) * self.dtype.itemsize
                seq = int(np.searchsorted(self.pointers, pos, side="right")) - 1
                self._raise_bad_token(int(chunk[bad[0]]), f"sequence {seq}", vocab_size)

    def check_sample(self, tokens: np.ndarray, vocab_size: int, sequence: int) -> None:
        """Cheap per-sample form of check_token_ids, used while reading training samples."""
        if len(tokens) and (tokens.max() >= vocab_size or tokens.min() < 0):
            bad = tokens[(tokens >= vocab_size) | (tokens < 0)][0]
            self._raise_bad_token(int(bad), f"a sample from sequence {sequence} on", vocab_size)

    def _raise_bad_token(self, token: int, where: str, vocab_size: int):
        raise InputError(
            f"data file {self.bin_path} holds token id {token} ({where}), expected "
            f"ids below the vocabulary size {vocab_size}; the data was tokenized with another "
            f"vocabulary: set data.tokenizer_type/data.tokenizer_model (or model.vocab_size for "
            f"the null tokenizer) to the one used by megatron-preprocess, or preprocess again")

    # ---- access ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def num_documents(self) -> int:
        return len(self.document_index) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.sizes.sum(dtype=np.int64))

    def get(self, i: int, offset: int = 0, length: Optional[int] = None) -> np.ndarray:
        """Tokens [offset, offset + length) of sequence i as a view into the mapped .bin."""
        size = int(self.sizes[i])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(f"tokens [{offset}, {offset + length}) of sequence {i} of "
                             f"{self.bin_path} are outside its {size} tokens")
        start = int(self.pointers[i]) + offset * self.dtype.itemsize
        return np.frombuffer(self._bin, self.dtype, length, start)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.get(i)


def _codes_text() -> str:
    return ", ".join(f"{k}={np.dtype(v)}" for k, v in DTYPE_CODES.items())
