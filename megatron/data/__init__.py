"""Data: tokenizers, indexed datasets, GPT sample indices, blending, and the iterators the loop
consumes. Imports only megatron.config and utilities.

The iterator names are loaded on first use, so tools that only tokenize or read .bin/.idx files
(megatron-preprocess and its worker processes) start without importing torch."""
from __future__ import annotations

import importlib
from typing import Optional

# Validation samples of the synthetic stream live far from the training ones.
_SYNTHETIC_VALID_OFFSET = 2 ** 40

_LAZY = {"Batch": "megatron.data.iterators", "DataIterators": "megatron.data.iterators",
         "micro_batches": "megatron.data.iterators", "SyntheticTokens": "megatron.data.synthetic"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'megatron.data' has no attribute {name!r}")


def tokenizer_vocab_size(cfg) -> int:
    """The unpadded vocabulary the model must cover: the tokenizer's, or model.vocab_size for
    synthetic and null-tokenizer data."""
    if cfg.data.synthetic:
        return cfg.model.vocab_size
    from megatron.data.tokenizers import build_tokenizer, spec_from_config
    return build_tokenizer(spec_from_config(cfg)).vocab_size


def build_iterators(cfg, dp_rank: int, dp_size: int, consumed_samples: int = 0,
                    vocab_size: Optional[int] = None, step: int = 0):
    """Iterators of (tokens, labels) micro-batches for one data-parallel rank (DataIterators).
    vocab_size: the tokenizer's, when the caller already knows it (the tokenizer is then not
    loaded a second time); real data only. step: the step the run resumes at; the training
    index holds what the run reads, consumed_samples plus its remaining steps' samples, when
    that is more than training.train_iters x global_batch_size (a resume that made the batch
    smaller), so no sample wraps to the start.

    With real data every rank of an initialized torch.distributed job must call this: rank 0
    builds missing index files while the others wait for it."""
    from megatron.data.iterators import DataIterators, micro_batches
    from megatron.data.synthetic import SyntheticTokens
    from megatron.data.tokenizers import eod_id

    t = cfg.training
    if cfg.data.synthetic:
        src = SyntheticTokens(cfg.model.vocab_size, cfg.model.seq_length, cfg.data.seed)
        eod = eod_id(cfg, "data.eod_mask_loss") if cfg.data.eod_mask_loss else None
        train = micro_batches(src.sample, len(src), consumed_samples, t.micro_batch_size,
                              t.global_batch_size, dp_rank, dp_size, eod=eod,
                              batch_at=t.global_batch_at)

        def valid():
            return micro_batches(src.sample, len(src), _SYNTHETIC_VALID_OFFSET,
                                 t.micro_batch_size, t.global_batch_size, dp_rank, dp_size,
                                 eod=eod)
        return DataIterators(train, valid, cfg.model.vocab_size)
    from megatron.data.gpt_dataset import build_gpt_iterators  # the real-data path
    reads = consumed_samples + t.samples_over(consumed_samples, max(t.train_iters - step, 0))
    return build_gpt_iterators(cfg, dp_rank, dp_size, consumed_samples, vocab_size, reads)


__all__ = ["Batch", "DataIterators", "build_iterators", "micro_batches", "SyntheticTokens",
           "tokenizer_vocab_size"]
