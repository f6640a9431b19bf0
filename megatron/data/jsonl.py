"""Reading JSON-lines corpora, plain or gzip-compressed (recognised by content, not name)."""
from __future__ import annotations

import gzip
import json
import os
from typing import IO, Iterator, Sequence, Tuple

from megatron.config.errors import InputError, unexpanded

_GZIP_MAGIC = b"\x1f\x8b"
_JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


def open_binary(path: str) -> IO[bytes]:
    if not os.path.isfile(path):
        raise InputError(f"input file {path} does not exist{unexpanded(path)}: expected a "
                         f"JSON-lines file "
                         f"(plain or .gz); fix the --input path")
    with open(path, "rb") as f:
        gz = f.read(2) == _GZIP_MAGIC
    return gzip.open(path, "rb") if gz else open(path, "rb")


def open_lines(path: str) -> Iterator[bytes]:
    """Raw lines; reading bytes lets the caller count input MB without re-encoding."""
    with open_binary(path) as f:
        try:
            yield from f
        except (OSError, EOFError) as e:  # a truncated or corrupt .gz
            raise InputError(f"input file {path} cannot be read to the end ({e}); expected a "
                             f"complete gzip or text file; fetch or compress it again") from None


def is_jsonl(path: str) -> bool:
    name = path[:-3] if path.endswith(".gz") else path
    return name.endswith(_JSONL_SUFFIXES)


def parse_json_line(raw: bytes, keys: Sequence[str], where: str) -> list:
    """The values of `keys` in one JSON object line, in key order."""
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise InputError(f"{where} is not valid JSON ({e}); expected one JSON object a line")
    if not isinstance(doc, dict):
        raise InputError(f"{where} holds a JSON {type(doc).__name__}, expected an object such "
                         f"as {{\"text\": \"...\"}}")
    missing = [k for k in keys if k not in doc]
    if missing:
        raise InputError(f"{where} has no key {missing[0]!r} (keys: {', '.join(sorted(doc))}); "
                         f"expected the --json-keys {', '.join(keys)}; pass --json-keys with "
                         f"the key that holds the text")
    return [doc[k] for k in keys]


def iter_json_texts(path: str, keys: Sequence[str]) -> Iterator[Tuple[str, str]]:
    """(key, text) for every non-empty line of a JSON-lines file."""
    for number, raw in enumerate(open_lines(path), start=1):
        if raw.strip():
            values = parse_json_line(raw, keys, f"{path}:{number}")
            for key, value in zip(keys, values):
                if isinstance(value, str):
                    yield key, value
