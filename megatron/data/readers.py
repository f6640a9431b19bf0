"""Corpus readers for megatron-preprocess: every input route becomes one stream of items in a
stable order, whatever the format.

Formats are told by content, not by name: parquet ("PAR1"), zstd (its frame magic), gzip, an
Arrow IPC stream (what `datasets`' save_to_disk writes: a continuation marker first) and, for the
rest, JSON lines. A directory is a `datasets` folder when it holds state.json (a Dataset) or
dataset_dict.json (a DatasetDict: one split of it), else a folder of shards read in path order;
an input with glob characters is its sorted matches. Many shards are one corpus: the output is
the same as for one file holding their documents in that order.

An item is what one worker tokenizes: ("json", raw line) for JSON lines, parsed in the worker,
or ("values", [value per key]) for columnar formats, whose columns are picked here. Memory stays
bounded: JSON lines and zstd stream a block at a time, parquet is read one row batch at a time
(never a whole file), Arrow streams one record batch at a time without memory-mapping.

pyarrow and zstandard are imported only when such an input is read."""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple

from megatron.config.errors import InputError, unexpanded
from megatron.data.jsonl import open_binary

PARQUET, ZSTD, GZIP, ARROW, JSONL, DATASETS = ("parquet", "zstd", "gzip", "arrow", "jsonl",
                                               "datasets")
_MAGIC = ((b"PAR1", PARQUET), (b"\x28\xb5\x2f\xfd", ZSTD), (b"\x1f\x8b", GZIP),
          (b"\xff\xff\xff\xff", ARROW), (b"ARROW1", ARROW))
# In a folder of shards, files read as data (others, such as a README, are left out and named).
DATA_SUFFIXES = (".parquet", ".jsonl", ".json", ".ndjson", ".gz", ".zst", ".zstd", ".arrow")
_BATCH_ROWS = 1024  # rows per columnar batch: a few MB of text, never a whole row group
_BLOCK = 1 << 20    # bytes per compressed read

Item = Tuple[str, object]


@dataclass(frozen=True)
class Source:
    """One file of the corpus and its format."""
    path: str
    kind: str
    size: int  # bytes on disk (for the progress bar's ETA)


def sniff(path: str) -> str:
    if os.path.isdir(path):
        return DATASETS
    with open(path, "rb") as f:
        head = f.read(8)
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    return JSONL


def expand_inputs(inputs: Sequence[str], split: Optional[str] = None) -> List[Source]:
    """The files of every input, in order: a file as it is, a glob's sorted matches, a folder's
    data files in path order, a `datasets` folder's Arrow files in its own order."""
    out: List[Source] = []
    for given in inputs:
        for path in _paths_of(given, split):
            kind = sniff(path)
            out.append(Source(path, kind, os.path.getsize(path)))
    if split is not None and not any(_is_dataset_dict(g) for g in _given_folders(inputs)):
        # a split nothing reads would pass unseen: the corpus would not be the one asked for
        raise InputError(f"--split {split!r} picks a split of a `datasets` DatasetDict folder "
                         f"(one with dataset_dict.json), and no --input is one; drop --split, "
                         f"or pass the DatasetDict folder")
    return out


def _given_folders(inputs: Sequence[str]) -> List[str]:
    folders = []
    for given in map(os.fspath, inputs):
        matches = sorted(glob.glob(given, recursive=True)) if glob.has_magic(given) else [given]
        folders += [m for m in matches if os.path.isdir(m)]
    return folders


def _is_dataset_dict(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "dataset_dict.json"))


def _paths_of(given: str, split: Optional[str]) -> List[str]:
    if os.path.isdir(given):
        if _is_datasets_folder(given):
            return datasets_files(given, split)
        return _folder_files(given)
    if os.path.exists(given):
        return [given]
    if glob.has_magic(given):
        matches = sorted(glob.glob(given, recursive=True))
        if not matches:
            raise InputError(f"--input {given!r} matches no file: expected a glob such as "
                             f"'dump/*.parquet'; check the pattern (quote it from the shell)")
        return [p for m in matches for p in _paths_of(m, split)]
    raise InputError(f"input file {given} does not exist{unexpanded(given)}: expected a file "
                     f"(JSON lines, plain, "
                     f".gz or .zst; parquet), a folder of them, a glob or a `datasets` "
                     f"save_to_disk folder; fix the --input path")


def _is_datasets_folder(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, n)) for n in ("state.json", "dataset_dict.json"))


def _folder_files(folder: str) -> List[str]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [os.path.join(root, f) for f in files
                  if not f.startswith(".") and f.endswith(DATA_SUFFIXES)]
    if not found:
        raise InputError(f"folder {folder} holds no data file: expected files ending in "
                         f"{', '.join(DATA_SUFFIXES)}; pass the folder of the shards")
    return sorted(found)


def datasets_files(folder: str, split: Optional[str]) -> List[str]:
    """The Arrow files of a save_to_disk folder: state.json's _data_files, in order; for a
    DatasetDict, those of `split` (default: its only split, or "train")."""
    dict_file = os.path.join(folder, "dataset_dict.json")
    if os.path.isfile(dict_file):
        splits = _read_json(dict_file).get("splits")
        if not isinstance(splits, list) or not splits:
            raise InputError(f"{dict_file} names no splits: expected {{\"splits\": [...]}} as "
                             f"datasets' save_to_disk writes it; save the dataset again")
        chosen = split or (splits[0] if len(splits) == 1 else "train")
        if chosen not in splits:
            raise InputError(f"{folder} is a dataset dict without the split {chosen!r} "
                             f"(splits: {', '.join(splits)}); pass --split with one of them")
        return datasets_files(os.path.join(folder, chosen), None)
    state_file = os.path.join(folder, "state.json")
    files = _read_json(state_file).get("_data_files")
    if not isinstance(files, list) or not all(isinstance(f, dict) and "filename" in f
                                              for f in files):
        raise InputError(f"{state_file} has no list of data files (\"_data_files\"): expected "
                         f"the state.json of datasets' save_to_disk; save the dataset again")
    paths = [os.path.join(folder, f["filename"]) for f in files]
    for p in paths:
        if not os.path.isfile(p):
            raise InputError(f"{p}, named in {state_file}, does not exist: the folder is "
                             f"incomplete; copy or save the dataset again")
    return paths


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            obj = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"{path} cannot be read as JSON ({e}): expected the metadata file of "
                         f"a `datasets` save_to_disk folder; save the dataset again") from None
    return obj if isinstance(obj, dict) else {}


class Reader:
    """The items of one source; `position` is how far into its file on disk the reading is."""

    def __init__(self, source: Source, keys: Sequence[str]):
        self.source, self.keys, self.position = source, list(keys), 0

    def items(self) -> Iterator[Tuple[int, Item]]:
        """(line or row number from 1, item)."""
        kind = self.source.kind
        if kind in (PARQUET, ARROW):
            return self._columnar()
        return self._lines()

    def _lines(self) -> Iterator[Tuple[int, Item]]:
        raw = zstd_lines(self.source.path, self) if self.source.kind == ZSTD else \
            self._plain_lines()
        for number, line in enumerate(raw, start=1):
            if not line.endswith(b"\n"):
                _check_last_line(line, self.source.path, number)
            if line.strip():
                yield number, ("json", line)

    def _plain_lines(self) -> Iterator[bytes]:
        path = self.source.path
        with open_binary(path) as f:
            raw = getattr(f, "fileobj", None) or f  # a gzip file's compressed position
            try:
                for line in f:
                    self.position = raw.tell()
                    yield line
            except (OSError, EOFError) as e:
                raise InputError(f"input file {path} cannot be read to the end ({e}); expected "
                                 f"a complete gzip or text file; fetch or compress it "
                                 f"again") from None

    def _columnar(self) -> Iterator[Tuple[int, Item]]:
        from megatron.data import columnar
        row = 0
        for columns in columnar.batches(self.source, self.keys, _BATCH_ROWS, self):
            for values in zip(*columns):
                row += 1
                yield row, ("values", list(values))


def _check_last_line(line: bytes, path: str, number: int) -> None:
    """A last line without its newline is where a cut file ends, unless it is a whole JSON
    value (many writers leave the final newline out). A zstd or gzip file cut between two
    frames or members decodes without error, so this is what catches it too."""
    if not line.strip():
        return
    try:
        json.loads(line)
    except ValueError:
        raise InputError(f"{path}:{number} is cut: the file ends inside this line (no newline, "
                         f"not valid JSON), so the file is truncated and its last documents "
                         f"are missing; fetch, copy or compress it again") from None


def zstd_lines(path: str, reader: Reader) -> Iterator[bytes]:
    """The lines of a zstd file (any number of frames, windows up to 2 GiB as `zstd --long`
    writes), a block at a time. A file that ends inside a frame, or does not decode, is one
    InputError naming it."""
    import zstandard

    def bad(why: str) -> InputError:
        return InputError(f"input file {path} is not a complete zstd file ({why}); expected "
                          f"JSON lines compressed with zstd (.jsonl.zst); fetch or compress it "
                          f"again")

    dctx = zstandard.ZstdDecompressor(max_window_size=2 ** 31)
    tail, dobj, in_frame = b"", dctx.decompressobj(), False
    with open(path, "rb") as f:
        while True:
            block = f.read(_BLOCK)
            reader.position = f.tell()
            if not block:
                break
            while block:
                try:
                    data = dobj.decompress(block)
                except zstandard.ZstdError as e:
                    raise bad(str(e)) from None
                in_frame = not dobj.eof
                block = dobj.unused_data if dobj.eof else b""
                if dobj.eof:  # the next frame, if any, starts in what this one left
                    dobj = dctx.decompressobj()
                lines = (tail + data).split(b"\n")
                tail = lines.pop()
                for line in lines:
                    yield line + b"\n"
    if in_frame:
        raise bad("it ends inside a frame: the file is truncated")
    if tail:
        yield tail
