"""Data: tokenizers, indexed datasets, GPT sample indices, blending, and the iterators the loop
consumes. Imports only megatron.config and utilities."""
from __future__ import annotations

from megatron.data.iterators import Batch, DataIterators, micro_batches
from megatron.data.synthetic import SyntheticTokens

# Validation samples of the synthetic stream live far from the training ones.
_SYNTHETIC_VALID_OFFSET = 2 ** 40


def build_iterators(cfg, dp_rank: int, dp_size: int, consumed_samples: int = 0) -> DataIterators:
    """Iterators of (tokens, labels) micro-batches for one data-parallel rank."""
    t = cfg.training
    if cfg.data.synthetic:
        src = SyntheticTokens(cfg.model.vocab_size, cfg.model.seq_length, cfg.data.seed)
        train = micro_batches(src.sample, len(src), consumed_samples, t.micro_batch_size,
                              t.global_batch_size, dp_rank, dp_size)

        def valid():
            return micro_batches(src.sample, len(src), _SYNTHETIC_VALID_OFFSET,
                                 t.micro_batch_size, t.global_batch_size, dp_rank, dp_size)
        return DataIterators(train, valid, cfg.model.vocab_size)
    from megatron.data.gpt_dataset import build_gpt_iterators  # the real-data path
    return build_gpt_iterators(cfg, dp_rank, dp_size, consumed_samples)


__all__ = ["Batch", "DataIterators", "build_iterators", "micro_batches", "SyntheticTokens"]
