"""JSON lines -> MMIDIDX datasets: one PREFIX_{key}_document.bin/.idx per JSON key, as
Megatron-LM names them, with tools/preprocess_data.py's semantics so the files are byte for byte
the same: a JSON line is one document; a text is one sequence, and a list of texts one sequence
per non-empty element; --append-eod ends the document's last sequence with the eod token; a
document with no tokens is kept as an empty document (no sequences); tokens are uint16 below
65500 ids, else int32.

Work split: the main process reads raw lines and writes the outputs; N worker processes (each
with its own tokenizer, rebuilt from a TokenizerSpec) parse JSON and tokenize, which is where the
time goes. Results come back in input order, so the output does not depend on N."""
from __future__ import annotations

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
from megatron.data.jsonl import open_lines, parse_json_line
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
    # Lines per message to a worker: amortizes pickling, yet small enough that a few large
    # documents still spread over all workers.
    chunksize: int = 16


@dataclass
class PreprocessStats:
    documents: int = 0  # input lines (JSON objects) read
    empty: int = 0  # (line, key) pairs whose text tokenized to nothing: empty documents
    tokens: int = 0
    bytes: int = 0  # uncompressed input bytes
    seconds: float = 0.0

    @property
    def docs_per_s(self) -> float:
        return self.documents / max(self.seconds, 1e-9)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / max(self.seconds, 1e-9)

    def line(self) -> str:
        return (f"{self.documents:,} documents, {self.tokens:,} tokens, {self.bytes / 1e6:,.1f} MB"
                f" in {self.seconds:.1f} s ({self.docs_per_s:,.0f} docs/s, "
                f"{self.mb_per_s:.2f} MB/s)")


def output_prefixes(output_prefix: str, json_keys: Sequence[str]) -> List[str]:
    return [f"{output_prefix}_{key}_document" for key in json_keys]


# Per-process state of a worker (and of the main process when workers == 1). A module global
# because multiprocessing initializers have nowhere else to put it.
_STATE: dict = {}


def _init_worker(spec: TokenizerSpec, keys: Sequence[str], append_eod: bool, dtype: str,
                 inputs: Sequence[str]) -> None:
    tok = build_tokenizer(spec)
    _STATE.update(tokenizer=tok, keys=list(keys), eod=tok.eod if append_eod else None,
                  dtype=np.dtype(dtype), inputs=list(inputs))


Document = Tuple[np.ndarray, List[int]]  # the tokens of all its sequences, and their lengths


def _encode(item: Tuple[int, int, bytes]) -> Tuple[int, List[Document]]:
    """(file number, line number, raw line) -> (bytes, one document per key)."""
    file_no, line_no, raw = item
    where = f"{_STATE['inputs'][file_no]}:{line_no}"
    values = parse_json_line(raw, _STATE["keys"], where)
    out = []
    for key, value in zip(_STATE["keys"], values):
        ids: List[int] = []
        lengths: List[int] = []
        for sentence in _sentences(value, f"{where}: key {key!r}"):
            sentence_ids = _STATE["tokenizer"].tokenize(sentence) if sentence else []
            if sentence_ids:  # Megatron-LM writes no zero-length sequence
                ids.extend(sentence_ids)
                lengths.append(len(sentence_ids))
        if ids and _STATE["eod"] is not None:
            ids.append(_STATE["eod"])
            lengths[-1] += 1
        out.append((np.asarray(ids, dtype=_STATE["dtype"]), lengths))
    return len(raw), out


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


def _lines(inputs: Sequence[str]) -> Iterator[Tuple[int, int, bytes]]:
    for file_no, path in enumerate(inputs):
        for line_no, raw in enumerate(open_lines(path), start=1):
            if raw.strip():
                yield file_no, line_no, raw


@contextlib.contextmanager
def _encoded(job: PreprocessJob, dtype: np.dtype):
    """An iterator of _encode results, in input order, from a pool or from this process."""
    init = (job.tokenizer, list(job.json_keys), job.append_eod, dtype.str, list(job.inputs))
    if job.workers <= 1:
        _init_worker(*init)
        yield map(_encode, _lines(job.inputs))
        return
    with multiprocessing.get_context().Pool(job.workers, _init_worker, init) as pool:
        yield pool.imap(_encode, _lines(job.inputs), chunksize=job.chunksize)


def preprocess(job: PreprocessJob, progress: Optional[Callable[[PreprocessStats], None]] = None,
               interval: float = 1.0) -> Tuple[List[str], PreprocessStats]:
    """Writes the datasets; returns their prefixes and the totals. `progress` is called about
    every `interval` seconds (default: a log line)."""
    if job.workers < 1:
        raise InputError(f"--workers={job.workers} is invalid: expected at least 1")
    tokenizer = build_tokenizer(job.tokenizer)  # fails here, before any worker starts
    if job.append_eod:
        _ = tokenizer.eod  # raises now, not in a worker, when the tokenizer has none
    dtype = optimal_token_dtype(tokenizer.vocab_size)
    prefixes = output_prefixes(job.output_prefix, job.json_keys)
    report = progress or (lambda s: log.info("%s", s.line()))
    stats, start = PreprocessStats(), time.monotonic()
    next_report = start + interval
    with contextlib.ExitStack() as stack:
        builders = [stack.enter_context(IndexedDatasetBuilder(p, dtype)) for p in prefixes]
        results = stack.enter_context(_encoded(job, dtype))
        for nbytes, docs in results:
            stats.documents += 1
            stats.bytes += nbytes
            for builder, (tokens, lengths) in zip(builders, docs):
                builder.add_document(tokens, lengths)
                stats.tokens += len(tokens)
                stats.empty += not lengths
            now = time.monotonic()
            if now >= next_report:
                stats.seconds = now - start
                report(stats)
                next_report = now + interval
    stats.seconds = time.monotonic() - start
    report(stats)
    return prefixes, stats
