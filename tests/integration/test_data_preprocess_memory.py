"""megatron-preprocess keeps its memory bounded on inputs larger than what a bound would allow if
they were held whole: 1 GB of JSON lines, and a parquet file of 1 GB of text (uncompressed, no
dictionary, two row groups of 0.5 GB each), through 2 workers. The peak of the summed resident
memory of the tool's process tree (sampled every 50 ms) must stay under 2 GiB, and the output
must hold every document. The inputs are generated in a temporary folder and removed after."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil
import pytest

from tests.support.cli import clean_env
from tests.support.paths import ROOT
from megatron.data.indexed_dataset import IndexedDataset

GB = 10 ** 9
BOUND = 2 * 2 ** 30


def _pool():
    rng = np.random.default_rng(0)
    # Documents of 100 to 60,000 token ids (up to ~300 KB), as a web corpus mixes them.
    sizes = np.concatenate([rng.integers(100, 3000, 150), rng.integers(20000, 60000, 10)])
    return [" ".join(map(str, rng.integers(0, 50000, size=int(n)))) for n in sizes]


def _jsonl(path, target):
    pool, size, count = _pool(), 0, 0
    with open(path, "w") as f:
        while size < target:
            line = json.dumps({"text": pool[count % len(pool)]}) + "\n"
            f.write(line)
            size, count = size + len(line), count + 1
    return count


def _parquet(path, target):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pool, written, count = _pool(), 0, 0
    schema = pa.schema([("text", pa.string())])
    with pq.ParquetWriter(path, schema, compression="none", use_dictionary=False) as w:
        while written < target:
            texts, size = [], 0
            while size < target // 2:  # one row group of half the text
                texts.append(pool[count % len(pool)])
                size, count = size + len(texts[-1]), count + 1
            w.write_table(pa.table({"text": texts}), row_group_size=len(texts))
            written += size
    return count


def _peak_rss(cmd):
    proc = subprocess.Popen(cmd, cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    root, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            tree = [root] + root.children(recursive=True)
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.05)
    out, err = proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    return peak, out


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_memory_stays_bounded_on_1gb(kind):
    if kind == "parquet":
        pytest.importorskip("pyarrow", reason="installed by `make setup` (the dev extra)")
    folder = tempfile.mkdtemp(prefix="megatron-mem-")
    try:
        src = os.path.join(folder, f"big.{kind}")
        documents = (_jsonl if kind == "jsonl" else _parquet)(src, GB)
        assert os.path.getsize(src) >= GB
        cmd = [sys.executable, "-m", "megatron.cli.preprocess", "--input", src,
               "--output-prefix", os.path.join(folder, "out"), "--tokenizer-type", "null",
               "--vocab-size", "50257", "--workers", "2", "--log-interval", "5"]
        started = time.monotonic()
        peak, out = _peak_rss(cmd)
        seconds = time.monotonic() - started
        print(f"{kind}: {os.path.getsize(src) / GB:.2f} GB, peak RSS of the tool's processes "
              f"{peak / 2 ** 20:.0f} MiB, {seconds:.0f} s")
        assert peak < BOUND, f"{kind}: peak {peak / 2 ** 30:.2f} GiB over the 2 GiB bound"
        assert IndexedDataset(os.path.join(folder, "out_text_document")).num_documents == documents
    finally:
        shutil.rmtree(folder, ignore_errors=True)
