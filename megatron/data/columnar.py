"""Columnar corpora through pyarrow: parquet files (FineWeb, FineWeb-Edu) and Arrow IPC streams
(the data-*.arrow files of `datasets`' save_to_disk), a batch of rows at a time.

Parquet is read with iter_batches over the chosen columns only, so memory holds one batch of one
row group's columns, never a whole 2 GB shard. Arrow streams are read through a plain file (no
memory map: mapped pages would count in the process's memory as the file is walked), one record
batch at a time. A truncated or corrupt file is one InputError naming it, also one cut exactly
between two record batches, which pyarrow's stream reader takes for a shorter stream: a stream
must end with its end-of-stream marker (issue 41 item 5), a file with its footer."""
from __future__ import annotations

from typing import Iterator, List, Sequence

from megatron.config.errors import InputError

# An IPC stream's end-of-stream marker: a continuation token and a zero metadata length.
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def _pyarrow():
    try:
        import pyarrow  # noqa: F401
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise InputError("reading parquet or Arrow input needs pyarrow: pip install pyarrow "
                         "(or pip install 'megatron-frontier[data]')") from None
    return pyarrow


def batches(source, keys: Sequence[str], rows: int, reader) -> Iterator[List[list]]:
    """Per batch, one Python list per key (the column's values in row order). reader.position
    follows the bytes of the file read so far."""
    pa = _pyarrow()
    what = "a parquet file" if source.kind == "parquet" else "an Arrow IPC stream"
    try:
        if source.kind == "parquet":
            yield from _parquet(pa, source, keys, rows, reader)
        else:
            yield from _arrow(pa, source, keys, reader)
    except (pa.ArrowException, OSError) as e:
        why = " ".join(str(e).split())  # pyarrow's messages span lines
        raise InputError(f"input file {source.path} cannot be read as {what} ({why}); expected "
                         f"a complete, uncorrupted file; fetch or write it again") from None


def _columns_of(schema_names: List[str], keys: Sequence[str], path: str) -> None:
    missing = [k for k in keys if k not in schema_names]
    if missing:
        raise InputError(f"{path} has no column {missing[0]!r} (columns: "
                         f"{', '.join(schema_names)}); pass --json-keys with the column that "
                         f"holds the text")


def _parquet(pa, source, keys, rows, reader) -> Iterator[List[list]]:
    # pre_buffer off and a read buffer: pages are read as decoded, not a whole column chunk
    # (a row group of a 2 GB shard can hold most of it).
    pf = pa.parquet.ParquetFile(source.path, memory_map=False, buffer_size=1 << 20,
                                pre_buffer=False)
    _columns_of(pf.schema_arrow.names, keys, source.path)
    meta, done = pf.metadata, 0
    total = max(meta.num_rows, 1)
    for batch in pf.iter_batches(batch_size=rows, columns=list(keys), use_threads=False):
        done += batch.num_rows
        reader.position = source.size * done // total
        yield [batch.column(k).to_pylist() for k in keys]


def _arrow(pa, source, keys, reader) -> Iterator[List[list]]:
    with pa.OSFile(source.path, "rb") as f:
        try:
            stream = pa.ipc.open_stream(f)
        except pa.ArrowInvalid:
            f.seek(0)  # the random-access file format ("ARROW1") also holds record batches
            yield from _arrow_file(pa, f, source, keys, reader)
            return
        _columns_of(stream.schema.names, keys, source.path)
        for batch in stream:
            # Arrow has no checksums: a full validation catches broken offsets and bad UTF-8.
            batch.validate(full=True)
            reader.position = f.tell()
            yield [batch.column(k).to_pylist() for k in keys]
        _check_end_of_stream(f, source.path)


def _check_end_of_stream(f, path: str) -> None:
    """The bytes before where the stream reader stopped must be the end-of-stream marker: a
    stream cut between record batches reads as complete but short."""
    end = f.tell()
    f.seek(max(0, end - len(END_OF_STREAM)))
    if f.read(len(END_OF_STREAM)) != END_OF_STREAM:
        raise InputError(f"input file {path} ends without an Arrow IPC stream's end-of-stream "
                         f"marker after {end} bytes: the file is truncated (cut between two "
                         f"record batches) and its last documents are missing; copy or save "
                         f"the dataset again")


def _arrow_file(pa, f, source, keys, reader) -> Iterator[List[list]]:
    try:
        table_reader = pa.ipc.open_file(f)
    except pa.ArrowInvalid as e:
        raise InputError(f"input file {source.path} is an Arrow IPC file (\"ARROW1\") without "
                         f"its footer ({' '.join(str(e).split())}): the file is truncated; "
                         f"copy or write it again") from None
    _columns_of(table_reader.schema.names, keys, source.path)
    n = max(table_reader.num_record_batches, 1)
    for i in range(table_reader.num_record_batches):
        batch = table_reader.get_batch(i)
        batch.validate(full=True)
        reader.position = source.size * (i + 1) // n
        yield [batch.column(k).to_pylist() for k in keys]
