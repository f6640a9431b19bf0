"""GPT samples over MMIDIDX datasets, with Megatron's semantics, and the real-data iterators.

Each dataset's sequences are split into train/valid/test ranges by data.split, as Megatron's GPT
dataset splits them (by sequence, not by document: a document written as several sequences may
straddle two splits, and an empty document, which has no sequence, counts for nothing); a split's
samples are seq_length + 1 consecutive tokens of the shuffled sequence stream (crossing sequence
boundaries), read through a shuffled sample order (see index_math.py). Several datasets are
blended by weight. Everything is a pure function of the data, the config and data.seed, so every
rank and every resumed run sees the same sample i."""
from __future__ import annotations

import functools
import logging
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np

from megatron.config.errors import InputError
from megatron.data.blended_dataset import BlendedDataset, blend_indices, default_cache_dir, \
    parse_paths, samples_per_dataset
from megatron.data.index_cache import file_digest, key_digest, load_or_build
from megatron.data.index_math import build_gpt_index, split_ranges
from megatron.data.indexed_dataset import IndexedDataset

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
_INDEX_ARRAYS = ("doc_idx", "sample_idx", "shuffle_idx")
# Datasets up to this many tokens get a full token-id scan when opened (well under a second);
# larger ones are checked sample by sample as they are read.
_FULL_SCAN_TOKENS = 1 << 26


class GPTDataset:
    """Samples of one split (a range of sequences) of one indexed dataset."""

    def __init__(self, indexed: IndexedDataset, split: str, sequences: Tuple[int, int],
                 num_samples: int, seq_length: int, seed: int, cache_dir: str,
                 impl: str = "auto", vocab_size: Optional[int] = None):
        self.indexed, self.split, self.vocab_size = indexed, split, vocab_size
        start, stop = sequences
        tokens = int(indexed.sizes[start:stop].sum(dtype=np.int64))
        if tokens == 0:
            raise InputError(f"the {split} split of {indexed.prefix} (sequences {start}..{stop})"
                             f" holds no tokens; expected non-empty sequences: preprocess "
                             f"again, or change data.split")
        key = key_digest({"idx": _digest(indexed.idx_path), "sequences": [start, stop],
                          "num_samples": num_samples, "seq_length": seq_length, "seed": seed})
        name = (f"{os.path.basename(indexed.prefix)}_{split}_{num_samples}ns_{seq_length}sl_"
                f"{seed}s_{key}")
        arrays = load_or_build(cache_dir, name, _INDEX_ARRAYS, lambda: build_gpt_index(
            indexed.sizes, np.arange(start, stop, dtype=np.int64), num_samples, seq_length, seed,
            impl))
        self.doc_idx, self.sample_idx = arrays["doc_idx"], arrays["sample_idx"]
        self.shuffle_idx = arrays["shuffle_idx"]
        if len(self.shuffle_idx) < num_samples or len(self.sample_idx) != len(self.shuffle_idx) + 1:
            raise InputError(f"data index {os.path.join(cache_dir, name)} holds "
                             f"{len(self.shuffle_idx)} samples, expected at least {num_samples}"
                             f"; delete that directory to rebuild it")
        log.info("%s split of %s: %d sequences, %d tokens, %d samples of %d tokens",
                 split, indexed.prefix, stop - start, tokens, len(self), seq_length + 1)

    def __len__(self) -> int:
        return len(self.shuffle_idx)

    def __getitem__(self, i: int) -> np.ndarray:
        """seq_length + 1 tokens as int64; inputs are [:-1], labels [1:]."""
        s = int(self.shuffle_idx[i])
        doc_f, off_f = (int(v) for v in self.sample_idx[s])
        doc_l, off_l = (int(v) for v in self.sample_idx[s + 1])
        get = self.indexed.get
        if doc_f == doc_l:
            parts = [get(int(self.doc_idx[doc_f]), off_f, off_l - off_f + 1)]
        else:
            parts = [get(int(self.doc_idx[doc_f]), off_f)]
            parts += [get(int(self.doc_idx[d])) for d in range(doc_f + 1, doc_l)]
            parts.append(get(int(self.doc_idx[doc_l]), 0, off_l + 1))
        sample = np.concatenate(parts).astype(np.int64)
        if self.vocab_size is not None:
            self.indexed.check_sample(sample, self.vocab_size, int(self.doc_idx[doc_f]))
        return sample


def _digest(path: str) -> str:
    """The .idx content hash, computed once per file version (train and valid both need it)."""
    st = os.stat(path)
    return _digest_of(os.path.abspath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _digest_of(path: str, size: int, mtime_ns: int) -> str:
    return file_digest(path)


def _open(prefix: str, vocab_size: Optional[int]) -> IndexedDataset:
    ds = IndexedDataset(prefix)
    if vocab_size is not None and ds.num_tokens <= _FULL_SCAN_TOKENS:
        ds.check_token_ids(vocab_size)
    return ds


def build_split(split: str, datasets: Sequence[IndexedDataset], weights: Sequence[float],
                split_text: str, num_samples: int, seq_length: int, seed: int,
                cache_dir: Optional[str], impl: str = "auto",
                vocab_size: Optional[int] = None):
    """The (blended) dataset of one split, or None when no dataset has sequences in it."""
    which = SPLITS.index(split)
    parts: List[Tuple[IndexedDataset, Tuple[int, int], float]] = []
    for ds, w in zip(datasets, weights):
        lo, hi = split_ranges(split_text, len(ds))[which]
        if hi > lo:
            parts.append((ds, (lo, hi), w))
    if not parts or num_samples <= 0:
        return None

    def make(ds, sequences, n):
        return GPTDataset(ds, split, sequences, n, seq_length, seed,
                          cache_dir or default_cache_dir(ds.prefix), impl, vocab_size)
    if len(parts) == 1:
        return make(parts[0][0], parts[0][1], num_samples)
    total = sum(w for _, _, w in parts)
    weights = [w / total for _, _, w in parts]
    index, within = blend_indices(weights, num_samples,
                                  cache_dir or default_cache_dir(parts[0][0].prefix), impl)
    counts = samples_per_dataset(index, len(parts))
    members = [make(ds, seqs, max(n, 1)) for (ds, seqs, _), n in zip(parts, counts)]
    return BlendedDataset(members, index, within)


def build_gpt_iterators(cfg, dp_rank: int, dp_size: int, consumed_samples: int = 0,
                        vocab_size: Optional[int] = None, train_samples: int = 0):
    """DataIterators over data.paths: train resumes at consumed_samples; valid and test restart
    at their first sample on every call, so successive evaluations compare like with like.
    vocab_size is the tokenizer's; the tokenizer is loaded for it only when it is not given."""
    from megatron.data.iterators import DataIterators, micro_batches
    from megatron.data.tokenizers import build_tokenizer, eod_of, spec_from_config

    d, t, evals = cfg.data, cfg.training, cfg.eval.eval_iters
    tokenizer = None
    if vocab_size is None or d.eod_mask_loss:  # only then: a large BPE file loads in seconds
        tokenizer = build_tokenizer(spec_from_config(cfg))
    vocab_size = tokenizer.vocab_size if vocab_size is None else vocab_size
    eod = eod_of(tokenizer, "data.eod_mask_loss") if d.eod_mask_loss else None
    weights, prefixes = parse_paths(d.paths)
    datasets = [_open(p, vocab_size) for p in prefixes]
    common = dict(split_text=d.split, seq_length=cfg.model.seq_length, seed=d.seed,
                  cache_dir=d.cache_dir, impl=d.index_impl, vocab_size=vocab_size)
    gb = t.global_batch_size
    train = build_split("train", datasets, weights,
                        num_samples=max(t.train_iters * gb, train_samples), **common)
    if train is None:
        raise InputError(f"data.split={d.split!r} leaves no training sequences in "
                         f"{', '.join(prefixes)}; expected a non-zero train share of at least "
                         f"one sequence (document): change data.split or add data")
    valid = build_split("valid", datasets, weights, num_samples=evals * gb, **common)
    batches = dict(micro_batch=t.micro_batch_size, global_batch=gb, dp_rank=dp_rank,
                   dp_size=dp_size, eod=eod)
    train_iter = micro_batches(train.__getitem__, len(train), consumed_samples,
                               batch_at=t.global_batch_at, **batches)

    test = build_split("test", datasets, weights, num_samples=evals * gb, **common)

    def held_out(split):
        if split is None:
            return None
        return lambda: micro_batches(split.__getitem__, len(split), 0, **batches)
    return DataIterators(train_iter, held_out(valid), vocab_size, held_out(test))
