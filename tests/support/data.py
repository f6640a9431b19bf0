"""Helpers shared by the test_data_* files: an MMIDIDX writer and reader written from the spec
in shared/REFERENCE.md (independent of megatron.data), a small corpus, a small SentencePiece
model trained once per test process."""
from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import struct
import tempfile
from typing import Dict, List

import numpy as np

SPEC_MAGIC = b"MMIDIDX\x00\x00"
SPEC_CODES = {1: "u1", 2: "i1", 3: "<i2", 4: "<i4", 5: "<i8", 6: "<f8", 7: "<f4", 8: "<u2"}


def spec_write(prefix: str, code: int, documents: List[List[List[int]]]) -> None:
    """documents: a list of documents, each a list of sequences of token ids."""
    dt = np.dtype(SPEC_CODES[code])
    sizes, pointers, doc_index, offset = [], [], [0], 0
    with open(prefix + ".bin", "wb") as b:
        for doc in documents:
            for seq in doc:
                data = np.asarray(seq, dtype=dt).tobytes()
                b.write(data)
                sizes.append(len(seq))
                pointers.append(offset)
                offset += len(data)
            doc_index.append(len(sizes))
    with open(prefix + ".idx", "wb") as f:
        f.write(SPEC_MAGIC)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(doc_index)))
        f.write(struct.pack(f"<{len(sizes)}i", *sizes))
        f.write(struct.pack(f"<{len(pointers)}q", *pointers))
        f.write(struct.pack(f"<{len(doc_index)}q", *doc_index))


def spec_read(prefix: str) -> Dict:
    with open(prefix + ".idx", "rb") as f:
        raw = f.read()
    assert raw[:9] == SPEC_MAGIC
    (version,), (code,) = struct.unpack_from("<Q", raw, 9), struct.unpack_from("<B", raw, 17)
    n, d = struct.unpack_from("<QQ", raw, 18)
    pos = 34
    sizes = list(struct.unpack_from(f"<{n}i", raw, pos))
    pos += 4 * n
    pointers = list(struct.unpack_from(f"<{n}q", raw, pos))
    pos += 8 * n
    doc_index = list(struct.unpack_from(f"<{d}q", raw, pos))
    assert pos + 8 * d == len(raw)
    with open(prefix + ".bin", "rb") as f:
        data = f.read()
    dt = np.dtype(SPEC_CODES[code])
    seqs = [np.frombuffer(data, dt, s, p).tolist() for s, p in zip(sizes, pointers)]
    return {"version": version, "code": code, "sizes": sizes, "pointers": pointers,
            "doc_index": doc_index, "sequences": seqs}


_WORDS = ("the king and queen of denmark shall speak now to thee my lord what is this light "
          "that breaks through yonder window it is the east and juliet is sun friends romans "
          "countrymen lend me your ears I come to bury caesar not praise him to be or not "
          "question whether nobler mind suffer slings arrows outrageous fortune").split()
_EXTRA = ["Héllo wörld — naïve café, 12 345 apples; x² ≥ ½!", "Tabs\tand  double  spaces\n",
          "Emoji 🙂 and CJK 中文字符 and Ελληνικά.", "It's, we'll, they've, I'd, she's: 'quoted'."]


def corpus_lines(n: int = 400, seed: int = 0) -> List[str]:
    """Reproducible English-like lines with a sprinkle of Unicode, digits and odd spacing."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        words = rng.choice(_WORDS, size=int(rng.integers(3, 16)))
        line = " ".join(words).capitalize() + rng.choice([".", ",", "!", "?", ";"])
        if i % 25 == 0:
            line += " " + _EXTRA[(i // 25) % len(_EXTRA)]
        lines.append(line)
    return lines


def documents(n_docs: int = 30, seed: int = 0) -> List[str]:
    lines = corpus_lines(n_docs * 12, seed)
    return ["\n".join(lines[i * 12:(i + 1) * 12]) for i in range(n_docs)]


@functools.lru_cache(maxsize=None)
def spm_model(vocab_size: int = 512) -> str:
    """A small SentencePiece BPE model, trained once per test process."""
    from megatron.data.tokenizers.train import train_sentencepiece

    directory = tempfile.mkdtemp(prefix="megatron-test-spm-")
    atexit.register(shutil.rmtree, directory, True)
    text = os.path.join(directory, "corpus.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(corpus_lines(2000, seed=1)) + "\n")
    return train_sentencepiece([text], os.path.join(directory, "spm"), vocab_size, "bpe")


def write_tokens(prefix: str, docs: List[List[int]], dtype=np.uint16) -> None:
    """A dataset of one sequence per document through the project's writer."""
    from megatron.data.indexed_builder import IndexedDatasetBuilder

    with IndexedDatasetBuilder(prefix, dtype) as b:
        for doc in docs:
            b.add_document(doc)


def require_helpers():
    """The compiled helper; `make test` always builds it, so its absence is a failure."""
    import pytest
    try:
        from megatron.data import _helpers
    except ImportError as e:
        pytest.fail(f"megatron.data._helpers is not built ({e}); build it with `make setup` or "
                    f"`pip install --no-build-isolation -e .`")
    return _helpers


def bytelevel_bpe(folder, texts: List[str], vocab_size: int = 700):
    """A GPT-2-style byte-level BPE trained with the `tokenizers` library on `texts`, saved in
    `folder` as vocab.json + merges.txt and as tokenizer.json; returns the tokenizer."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.model.save(str(folder))
    tok.save(str(folder / "tokenizer.json"))
    return tok


# Megatron-LM's preprocessing cases (tests/unit/test_data_megatron_preprocess.py and its command's
# test in tests/integration): one JSON row each.
ROWS = [
    {"text": "1 2 3"},
    {"text": ["4 5", "", "6"]},  # an empty sentence is no sequence
    {"text": ""},  # empty document
    {"text": []},  # empty document
    {"text": [[7, 8], [9]]},  # null tokenizer: a list of id lists, one sequence each
    {"text": [10, 11]},  # null tokenizer: one list of ids is one sequence
    {"text": ["", " "]},  # empty document
    {"text": "12"},
]


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)
