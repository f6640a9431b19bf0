"""A corpus (JSON lines, plain, gzip or zstd; parquet; `datasets` save_to_disk folders; folders
and globs of shards: megatron/data/readers.py) -> MMIDIDX datasets: one
PREFIX_{key}_document.bin/.idx per JSON key, as Megatron-LM names them, with
tools/preprocess_data.py's semantics so the files are byte for byte the same: a JSON line is
one document; a text is one sequence, and a list of texts one sequence per non-empty element;
--append-eod ends the document's last sequence with the eod token (--prepend-bos, beyond
Megatron-LM's script, begins its first with the bos token: Llama 3's and Gemma's documents
start so); a document with no tokens is kept as an empty document (no sequences); tokens are
uint16 below 65500 ids, else int32.

Every route gives the same files for the same texts: a parquet row or an Arrow row is a
document exactly as a JSON line holding the same values.

Work split: the main process reads the files (lines, or column batches) and writes the outputs;
N worker processes (each with its own tokenizer, rebuilt from a TokenizerSpec) parse JSON and
tokenize, which is where the time goes, in chunks of items from any file. Results come back in
input order, so the output does not depend on N. At most a fixed number of chunks is in flight
(a window, not the whole input as Pool.imap would queue), so memory does not grow with the
input."""
from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing
import time
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from megatron.config.errors import InputError
from megatron.data.indexed_builder import IndexedDatasetBuilder
from megatron.data.indexed_dataset import optimal_token_dtype
from megatron.data.jsonl import parse_json_line
from megatron.data.readers import Reader, Source, expand_inputs
from megatron.data.tokenizers import TokenizerSpec, build_tokenizer

log = logging.getLogger(__name__)


@dataclass
class PreprocessJob:
    inputs: Sequence[str]
    output_prefix: str
    tokenizer: TokenizerSpec
    json_keys: Sequence[str] = ("text",)
    append_eod: bool = False
    workers: int = 1
    # Items (lines, rows) per message to a worker: amortizes pickling, yet small enough that a
    # few large documents still spread over all workers; a chunk also ends at _CHUNK_BYTES.
    chunksize: int = 16
    split: Optional[str] = None  # a `datasets` DatasetDict folder's split (default: train)
    prepend_bos: bool = False  # each document begins with the tokenizer's bos token


@dataclass
class PreprocessStats:
    documents: int = 0  # input lines (JSON objects) read
    empty: int = 0  # (line, key) pairs whose text tokenized to nothing: empty documents
    tokens: int = 0
    bytes: int = 0  # uncompressed input bytes (JSON lines; text and token bytes of rows)
    seconds: float = 0.0
    disk_done: int = 0   # bytes of the input files on disk read so far
    disk_total: int = 0  # all of them: the ETA is the time for the rest at the rate so far

    @property
    def docs_per_s(self) -> float:
        return self.documents / max(self.seconds, 1e-9)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / max(self.seconds, 1e-9)

    @property
    def fraction(self) -> float:
        return min(self.disk_done / self.disk_total, 1.0) if self.disk_total else 0.0

    @property
    def eta_s(self) -> Optional[float]:
        f = self.fraction
        return self.seconds * (1 - f) / f if f > 0 else None

    def line(self) -> str:
        return (f"{self.documents:,} documents, {self.tokens:,} tokens, {self.bytes / 1e6:,.1f} MB"
                f" in {self.seconds:.1f} s ({self.docs_per_s:,.0f} docs/s, "
                f"{self.mb_per_s:.2f} MB/s)")

    def bar(self, width: int = 24) -> str:
        """A progress bar: share of the input read, documents, tokens, MB/s, ETA."""
        filled = int(self.fraction * width)
        eta = self.eta_s
        return (f"[{'#' * filled}{'.' * (width - filled)}] {self.fraction:4.0%} "
                f"{self.documents:,} docs {self.tokens:,} tokens {self.docs_per_s:,.0f} docs/s "
                f"{self.mb_per_s:.1f} MB/s "
                f"ETA {_clock(eta) if eta is not None else '?'}")


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def output_prefixes(output_prefix: str, json_keys: Sequence[str]) -> List[str]:
    return [f"{output_prefix}_{key}_document" for key in json_keys]


# Per-process state of a worker (and of the main process when workers == 1). A module global
# because multiprocessing initializers have nowhere else to put it.
_STATE: dict = {}


def _init_worker(spec: TokenizerSpec, keys: Sequence[str], append_eod: bool, dtype: str,
                 inputs: Sequence[str], prepend_bos: bool = False) -> None:
    tok = build_tokenizer(spec)
    _STATE.update(tokenizer=tok, keys=list(keys), eod=tok.eod if append_eod else None,
                  bos=tok.bos if prepend_bos else None, dtype=np.dtype(dtype),
                  inputs=list(inputs))


Document = Tuple[np.ndarray, List[int]]  # the tokens of all its sequences, and their lengths


def _encode(chunk: List[Tuple[int, int, tuple]]) -> List[Tuple[int, List[Document]]]:
    return [_encode_one(*item) for item in chunk]


def _encode_one(file_no: int, number: int, item: tuple) -> Tuple[int, List[Document]]:
    """(file number, line or row number, item) -> (bytes, one document per key)."""
    kind, payload = item
    path = _STATE["inputs"][file_no]
    if kind == "json":
        where = f"{path}:{number}"
        values, nbytes = parse_json_line(payload, _STATE["keys"], where), len(payload)
    else:
        where, values = f"{path} row {number}", payload
        nbytes = sum(_text_bytes(v) for v in values)
    out = []
    for key, value in zip(_STATE["keys"], values):
        ids: List[int] = []
        lengths: List[int] = []
        for sentence in _sentences(value, f"{where}: key {key!r}"):
            sentence_ids = _tokenize(sentence, f"{where}: key {key!r}") if sentence else []
            if sentence_ids:  # Megatron-LM writes no zero-length sequence
                ids.extend(sentence_ids)
                lengths.append(len(sentence_ids))
        if ids and _STATE["eod"] is not None:
            ids.append(_STATE["eod"])
            lengths[-1] += 1
        if ids and _STATE["bos"] is not None:
            ids.insert(0, _STATE["bos"])
            lengths[0] += 1
        out.append((np.asarray(ids, dtype=_STATE["dtype"]), lengths))
    return nbytes, out


def _tokenize(sentence, where: str) -> List[int]:
    """The tokenizer's ids; its refusal of a value (the null tokenizer's text or an id past
    the vocabulary) is raised naming the file and line or row it came from."""
    try:
        return _STATE["tokenizer"].tokenize(sentence)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None


def _text_bytes(value) -> int:
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, list):
        return sum(_text_bytes(v) for v in value)
    return 0


def _sentences(value, where: str) -> list:
    """The sequences of one JSON value: a text is one; a list (Megatron-LM's form of a document
    already split into sentences) gives one per element. For the null tokenizer, a list of
    integers is one sequence of token ids, and a list of such lists one sequence per list."""
    ids_ok = _STATE["tokenizer"].name == "null"
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        if ids_ok and _is_ids(value):
            return [value]
        if all(isinstance(v, str) or (ids_ok and isinstance(v, list) and _is_ids(v))
               for v in value):
            return value
    expected = "a text or a list of texts (one sequence each)"
    if ids_ok:
        expected += ", or token ids: a list of integers or a list of such lists"
    raise InputError(f"{where} holds {str(value)[:60]!r}, expected {expected}; fix that line "
                     f"of the input")


def _is_ids(value: list) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in value)


_CHUNK_BYTES = 1 << 20  # a chunk ends at this many bytes of lines (a few huge documents)
_WINDOW = 8  # chunks in flight per worker: keeps them busy, bounds what waits in queues


class _Chunks:
    """Chunks of (file number, number, item) over every source in order; `disk_done` follows
    the bytes read from disk."""

    def __init__(self, sources: Sequence[Source], keys: Sequence[str], chunksize: int):
        self.sources, self.keys, self.chunksize = sources, keys, chunksize
        self.finished, self.reader = 0, None

    @property
    def disk_done(self) -> int:
        return self.finished + (self.reader.position if self.reader else 0)

    def __iter__(self) -> Iterator[List[Tuple[int, int, tuple]]]:
        chunk, size = [], 0
        for file_no, source in enumerate(self.sources):
            self.reader = Reader(source, self.keys)
            for number, item in self.reader.items():
                chunk.append((file_no, number, item))
                size += len(item[1]) if item[0] == "json" else sum(
                    len(v) for v in item[1] if isinstance(v, str))
                if len(chunk) >= self.chunksize or size >= _CHUNK_BYTES:
                    yield chunk
                    chunk, size = [], 0
            self.finished += source.size
            self.reader = None
        if chunk:
            yield chunk


def _windowed(pool, chunks, window: int):
    """pool.imap in order, with at most `window` chunks submitted and not yet taken."""
    pending: collections.deque = collections.deque()
    for chunk in chunks:
        pending.append(pool.apply_async(_encode, (chunk,)))
        if len(pending) >= window:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


@contextlib.contextmanager
def _encoded(job: PreprocessJob, dtype: np.dtype, sources: Sequence[Source], chunks: _Chunks):
    """An iterator of _encode results (a list per chunk), in input order, from a pool or from
    this process."""
    paths = [s.path for s in sources]
    init = (job.tokenizer, list(job.json_keys), job.append_eod, dtype.str, paths,
            job.prepend_bos)
    if job.workers <= 1:
        _init_worker(*init)
        yield map(_encode, chunks)
        return
    with multiprocessing.get_context().Pool(job.workers, _init_worker, init) as pool:
        yield _windowed(pool, chunks, _WINDOW * job.workers)


def preprocess(job: PreprocessJob, progress: Optional[Callable[[PreprocessStats], None]] = None,
               interval: float = 1.0) -> Tuple[List[str], PreprocessStats]:
    """Writes the datasets; returns their prefixes and the totals. `progress` is called about
    every `interval` seconds (default: a log line)."""
    if job.workers < 1:
        raise InputError(f"--workers={job.workers} is invalid: expected at least 1")
    tokenizer = build_tokenizer(job.tokenizer)  # fails here, before any worker starts
    if job.append_eod:
        _ = tokenizer.eod  # raises now, not in a worker, when the tokenizer has none
    if job.prepend_bos:
        _ = tokenizer.bos
    dtype = optimal_token_dtype(tokenizer.vocab_size)
    sources = expand_inputs(job.inputs, job.split)
    prefixes = output_prefixes(job.output_prefix, job.json_keys)
    report = progress or (lambda s: log.info("%s", s.line()))
    chunks = _Chunks(sources, job.json_keys, job.chunksize)
    stats, start = PreprocessStats(disk_total=sum(s.size for s in sources)), time.monotonic()
    next_report = start + interval
    with contextlib.ExitStack() as stack:
        builders = [stack.enter_context(IndexedDatasetBuilder(p, dtype)) for p in prefixes]
        results = stack.enter_context(_encoded(job, dtype, sources, chunks))
        for encoded in results:
            for nbytes, docs in encoded:
                _add(stats, builders, nbytes, docs)
            now = time.monotonic()
            if now >= next_report:
                stats.seconds, stats.disk_done = now - start, chunks.disk_done
                report(stats)
                next_report = now + interval
    stats.seconds, stats.disk_done = time.monotonic() - start, stats.disk_total
    report(stats)
    return prefixes, stats


def _add(stats: PreprocessStats, builders, nbytes: int, docs: List[Document]) -> None:
    stats.documents += 1
    stats.bytes += nbytes
    for builder, (tokens, lengths) in zip(builders, docs):
        builder.add_document(tokens, lengths)
        stats.tokens += len(tokens)
        stats.empty += not lengths
