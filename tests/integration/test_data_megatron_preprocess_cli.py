"""megatron-preprocess run as a command on Megatron-LM's cases (tests/support/data.ROWS)
: it reports the documents without tokens and keeps them as empty ones."""
import subprocess
import sys

from megatron.data.indexed_dataset import IndexedDataset
from tests.support.paths import ROOT
from tests.support.data import ROWS, write_rows


def test_cli_reports_empty_documents(tmp_path):
    src = write_rows(tmp_path / "in.jsonl", ROWS)
    proc = subprocess.run([sys.executable, "-m", "megatron.cli.preprocess", "--input", src,
                           "--output-prefix", str(tmp_path / "o"), "--tokenizer-type", "null",
                           "--vocab-size", "200"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "3 documents had no tokens: kept as empty documents" in proc.stdout
    assert IndexedDataset(str(tmp_path / "o_text_document")).num_documents == len(ROWS)
