"""megatron-preprocess end to end, as a user runs it (subprocess): round trip of the tokenizer's
tokens, --workers 2 on gzip input, several JSON keys, merge, train-tokenizer, errors."""
import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.support.data import documents, spm_model, spec_read
from megatron.data.indexed_dataset import IndexedDataset
from megatron.data.tokenizers import TokenizerSpec, build_tokenizer
from tests.support.paths import ROOT


def run(*args, ok=True):
    proc = subprocess.run([sys.executable, "-m", "megatron.cli.preprocess", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("pp")
    docs = documents(40)
    rows = [{"text": t, "title": f"doc {i}"} for i, t in enumerate(docs)]
    rows[7]["text"] = ""  # kept as an empty document (no sequence), as Megatron-LM keeps it
    plain, gz = d / "in.jsonl", d / "in.jsonl.gz"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with gzip.open(gz, "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    return d, rows, str(plain), str(gz)


def spm_args():
    return ["--tokenizer-type", "sentencepiece", "--tokenizer-model", spm_model()]


def test_help_has_examples():
    out = run("--help").stdout
    assert "examples:" in out and "--workers" in out and "train-tokenizer" in out
    assert "--inputs" in run("merge", "--help").stdout


def test_round_trip_with_two_workers_on_gzip(inputs):
    d, rows, plain, gz = inputs
    run("--input", plain, "--output-prefix", str(d / "one"), *spm_args(), "--append-eod")
    two = run("--input", gz, "--output-prefix", str(d / "two"), *spm_args(), "--append-eod",
              "--workers", "2")
    assert "docs/s" in two.stderr and "MB/s" in two.stderr
    assert "1 documents had no tokens: kept as empty documents" in two.stdout
    tok = build_tokenizer(TokenizerSpec("sentencepiece", spm_model()))
    want = [tok.tokenize(r["text"]) + [tok.eod] for r in rows if r["text"]]
    ds = IndexedDataset(str(d / "two_text_document"))
    assert ds.dtype == np.uint16  # Megatron-LM's choice below 65500 ids
    assert [ds[i].tolist() for i in range(len(ds))] == want
    assert ds.num_documents == len(rows) and list(ds.document_index[7:9]) == [7, 7]
    for ext in (".bin", ".idx"):  # worker count does not change a byte
        a = (d / f"one_text_document{ext}").read_bytes()
        assert a == (d / f"two_text_document{ext}").read_bytes()
    assert not [n for n in os.listdir(d) if ".tmp-" in n]


def test_several_json_keys_make_one_dataset_each(inputs):
    d, rows, plain, _ = inputs
    run("--input", plain, "--output-prefix", str(d / "k"), "--json-keys", "title", "text",
        *spm_args())
    titles = IndexedDataset(str(d / "k_title_document"))
    texts = IndexedDataset(str(d / "k_text_document"))
    assert len(titles) == len(rows) and len(texts) == 39 and texts.num_documents == len(rows)


def test_null_tokenizer_and_merge(tmp_path):
    src = tmp_path / "ids.jsonl"
    src.write_text('{"text": [1, 2, 3]}\n{"text": "4 5"}\n')
    run("--input", str(src), "--output-prefix", str(tmp_path / "a"), "--tokenizer-type", "null",
        "--vocab-size", "200", "--append-eod")
    got = spec_read(str(tmp_path / "a_text_document"))["sequences"]
    assert got == [[1, 2, 3, 199], [4, 5, 199]]
    src.write_text('{"text": "7"}\n')
    run("--input", str(src), "--output-prefix", str(tmp_path / "b"), "--tokenizer-type",
        "NullTokenizer", "--vocab-size", "200")
    out = run("merge", "--inputs", str(tmp_path / "a_text_document"),
              str(tmp_path / "b_text_document"), "--output-prefix", str(tmp_path / "m"))
    assert "3 documents" in out.stdout
    got = spec_read(str(tmp_path / "m"))
    assert got["sequences"] == [[1, 2, 3, 199], [4, 5, 199], [7]]
    assert got["code"] == 8  # uint16, as Megatron-LM writes a vocabulary of 200 (never uint8)


def test_train_tokenizer_subcommand(inputs, tmp_path):
    d, _, _, gz = inputs
    out = run("train-tokenizer", "--input", gz, "--model-prefix", str(tmp_path / "t" / "spm"),
              "--vocab-size", "400", "--model-type", "unigram")
    model = str(tmp_path / "t" / "spm.model")
    assert f"wrote {model}" in out.stdout
    assert build_tokenizer(TokenizerSpec("sentencepiece", model)).vocab_size == 400


def test_truncated_gzip_input(tmp_path):
    from megatron.config.errors import InputError
    from megatron.data.preprocess import PreprocessJob, preprocess
    gz = tmp_path / "in.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        rng = np.random.default_rng(0)
        f.write("".join(json.dumps({"text": rng.integers(0, 9, 50).tolist()}) + "\n"
                        for _ in range(500)))
    gz.write_bytes(gz.read_bytes()[:-200])
    job = PreprocessJob([str(gz)], str(tmp_path / "o"), TokenizerSpec("null", vocab_size=9))
    with pytest.raises(InputError, match=r"in.jsonl.gz cannot be read to the end"):
        preprocess(job, progress=lambda s: None)
    assert os.listdir(tmp_path) == ["in.jsonl.gz"]


def test_errors_are_one_clear_line_and_leave_no_output(inputs, tmp_path):
    d, _, plain, _ = inputs
    p = run("--input", plain, "--output-prefix", str(tmp_path / "x"), "--json-keys", "body",
            *spm_args(), ok=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"{plain}:1 has no key 'body' (keys: text, title)" in p.stderr
    assert os.listdir(tmp_path) == []
    p = run("--input", plain, "--output-prefix", str(tmp_path / "x"), "--tokenizer-type",
            "sentencepiece", ok=False)
    assert "--tokenizer-model=None is not a file" in p.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\nnot json\n')
    p = run("--input", str(bad), "--output-prefix", str(tmp_path / "y"), *spm_args(),
            "--workers", "2", ok=False)
    assert f"{bad}:2 is not valid JSON" in p.stderr and p.returncode == 2
    p = run("merge", "--inputs", str(tmp_path / "none"), "--output-prefix", str(tmp_path / "z"),
            ok=False)
    assert "none.idx does not exist" in p.stderr
