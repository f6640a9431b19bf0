#!/usr/bin/env python3
"""Preprocessing throughput of megatron-preprocess with 1 and 2 worker processes.

Corpus: the demo Shakespeare text cut into ~4 KB documents (web-document sized) and repeated
--copies times. Tokenizers: the demo SentencePiece BPE (4096 pieces) and, when the optional
`tokenizers` library is installed to train a vocabulary for it, our pure-Python GPT-2 byte-level
BPE. Results go to benchmarks/results/data.json and data.md.

examples:
  python benchmarks/data/bench_preprocess.py
  python benchmarks/data/bench_preprocess.py --copies 1 --workers 1 2
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import ROOT, machine, save  # noqa: E402
from megatron.data.demo import prepare_demo_data  # noqa: E402
from megatron.data.preprocess import PreprocessJob, preprocess  # noqa: E402
from megatron.data.tokenizers import TokenizerSpec  # noqa: E402


def make_corpus(demo_jsonl: str, out: str, copies: int, target: int = 4000) -> int:
    """Cut every work at blank lines into documents of about `target` characters."""
    docs = []
    with open(demo_jsonl) as f:
        for line in f:
            chunk = []
            for para in json.loads(line)["text"].split("\n\n"):
                chunk.append(para)
                if sum(map(len, chunk)) >= target:
                    docs.append("\n\n".join(chunk))
                    chunk = []
            if chunk:
                docs.append("\n\n".join(chunk))
    with open(out, "w") as f:
        for _ in range(copies):
            for d in docs:
                f.write(json.dumps({"text": d}) + "\n")
    return len(docs) * copies


def gpt2_vocab(corpus: str, directory: str):
    """vocab.json/merges.txt of an 8k byte-level BPE trained by `tokenizers` (if installed)."""
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    except ImportError:
        return None
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    with open(corpus) as f:
        tok.train_from_iterator((json.loads(l)["text"] for l in f), trainer)
    tok.model.save(directory)
    return os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt")


def cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def measure(name: str, spec: TokenizerSpec, corpus: str, workers: int, tmp: str) -> dict:
    job = PreprocessJob([corpus], os.path.join(tmp, f"{name}_{workers}"), spec, ("text",),
                        append_eod=True, workers=workers)
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    _, stats = preprocess(job, progress=lambda s: None)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    row = {"tokenizer": name, "workers": workers, "documents": stats.documents,
           "mb": stats.bytes / 1e6, "seconds": wall, "cpu_seconds": cpu,
           "mb_per_s": stats.bytes / 1e6 / wall, "docs_per_s": stats.documents / wall,
           "tokens_per_s": stats.tokens / wall}
    print(f"{name:14s} workers={workers}: {row['mb_per_s']:.2f} MB/s, "
          f"{row['docs_per_s']:,.0f} docs/s ({wall:.1f} s wall, {cpu:.1f} s CPU)")
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--copies", type=int, default=2)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    a = p.parse_args()
    at_start = machine()
    demo = prepare_demo_data(os.path.join(ROOT, ".cache", "demo"))
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.jsonl")
        n_docs = make_corpus(os.path.join(os.path.dirname(demo.tokenizer_model),
                                          "shakespeare.jsonl"), corpus, a.copies)
        tokenizers = [("sentencepiece", TokenizerSpec("sentencepiece", demo.tokenizer_model))]
        files = gpt2_vocab(corpus, tmp)
        if files:
            tokenizers.append(("gpt2 (ours)", TokenizerSpec("gpt2", None, *files)))
        runs = [measure(name, spec, corpus, w, tmp) for name, spec in tokenizers
                for w in a.workers]
    size = os.path.getsize(os.path.join(ROOT, ".cache", "demo", "shakespeare.jsonl"))
    save("preprocess", {
        "corpus": f"Shakespeare (demo), {n_docs:,} documents of ~4 KB "
                  f"({a.copies} copies of {size / 1e6:.1f} MB)",
        "runs": runs,
        "notes": ["MB are uncompressed input bytes; wall time includes reading JSON lines, "
                  "tokenizing and writing .bin/.idx; --append-eod.",
                  "gpt2 (ours) is the pure-Python byte-level BPE with an 8192-token vocabulary "
                  "trained by the `tokenizers` library on the same corpus.",
                  "With 2 workers on 2 cores the main process (reading, writing) competes with "
                  "the workers for the cores.",
                  "CPU s sums all processes. On a shared machine wall time depends on other "
                  "load (see the load average); MB per CPU second does not, and bounds the "
                  "throughput per core of an idle machine."]}, at_start)


if __name__ == "__main__":
    main()
