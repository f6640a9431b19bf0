"""megatron-preprocess as a user runs it on the new inputs: a folder of parquet and zstd shards
gives the same files as the JSON lines, and the progress bar names documents, tokens, MB/s and
the ETA; a truncated parquet, zstd or Arrow file is one error line naming it, exit 2, no
traceback."""
import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tests.support.cli import clean_env
from tests.support.paths import ROOT

ROWS = [{"text": " ".join(str((i * 7 + j) % 300) for j in range(i % 40))} for i in range(200)]


def run(*args):
    return subprocess.run([sys.executable, "-m", "megatron.cli.preprocess", *args,
                           "--tokenizer-type", "null", "--vocab-size", "300", "--append-eod",
                           "--log-interval", "0"], cwd=ROOT, env=clean_env(),
                          capture_output=True, text=True, timeout=120)


def _bytes(prefix):
    return [open(f"{prefix}_text_document{ext}", "rb").read() for ext in (".bin", ".idx")]


def test_folder_of_shards_through_the_command(tmp_path):
    (tmp_path / "all.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    shards = tmp_path / "shards"
    shards.mkdir()
    pq.write_table(pa.Table.from_pylist(ROWS[:120]), shards / "a.parquet", row_group_size=50)
    (shards / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        "".join(json.dumps(r) + "\n" for r in ROWS[120:]).encode()))
    ref = run("--input", str(tmp_path / "all.jsonl"), "--output-prefix", str(tmp_path / "ref"))
    got = run("--input", str(shards), "--output-prefix", str(tmp_path / "got"), "--workers", "2")
    assert ref.returncode == 0 and got.returncode == 0, got.stderr
    assert _bytes(str(tmp_path / "got")) == _bytes(str(tmp_path / "ref"))
    for part in ("100%", "200 docs", "tokens", "MB/s", "ETA"):
        assert part in got.stderr, f"{part!r} not in the progress bar: {got.stderr}"


@pytest.mark.parametrize("name", ["x.parquet", "x.jsonl.zst", "x.arrow"])
def test_truncated_input_is_one_error_naming_it(tmp_path, name):
    path = tmp_path / name
    table = pa.Table.from_pylist(ROWS)
    if name.endswith(".parquet"):
        pq.write_table(table, path, row_group_size=50)
    elif name.endswith(".zst"):
        path.write_bytes(zstandard.ZstdCompressor().compress(
            "".join(json.dumps(r) + "\n" for r in ROWS).encode()))
    else:
        with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
            for batch in table.to_batches(max_chunksize=50):
                w.write_batch(batch)
    path.write_bytes(path.read_bytes()[:path.stat().st_size * 3 // 4])
    proc = run("--input", str(path), "--output-prefix", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [l for l in proc.stderr.splitlines() if "error" in l]
    assert len(lines) == 1 and str(path) in lines[0], proc.stderr
    assert not (tmp_path / "out_text_document.bin").exists(), "a partial output was left"


def test_a_datasets_folder_with_a_shard_cut_between_record_batches_fails_naming_it(tmp_path):
    """The reported case: save_to_disk's Arrow streams, the second cut exactly after a record
    batch, preprocessed with exit 0 and fewer documents; now exit 2 naming the shard."""
    folder, names, cut_at = tmp_path / "ds", [], 0
    folder.mkdir()
    for i, part in enumerate((ROWS[:100], ROWS[100:])):
        cut_at = 0
        name = f"data-{i:05d}-of-00002.arrow"
        table = pa.Table.from_pylist(part)
        with pa.OSFile(str(folder / name), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
            for batch in table.to_batches(max_chunksize=40):
                w.write_batch(batch)
                cut_at = cut_at or f.tell()
        names.append({"filename": name})
    (folder / "state.json").write_text(json.dumps({"_data_files": names}))
    shard = folder / names[1]["filename"]
    shard.write_bytes(shard.read_bytes()[:cut_at])
    proc = run("--input", str(folder), "--output-prefix", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if "error" in l]
    assert len(lines) == 1 and str(shard) in lines[0] and "end-of-stream" in lines[0], proc.stderr
    assert not (tmp_path / "out_text_document.bin").exists(), "a partial output was left"
