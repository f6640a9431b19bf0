"""Vocabulary padding, as Megatron does: a multiple of make_vocab_size_divisible_by x TP so each
tensor-parallel rank holds an equal, GEMM-friendly slice of the embedding."""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    multiple = divisible_by * tp
    padded = -(-vocab_size // multiple) * multiple
    if padded != vocab_size:
        log.info("vocabulary padded from %d to %d (%d dummy tokens, a multiple of %d x TP %d)",
                 vocab_size, padded, padded - vocab_size, divisible_by, tp)
    return padded
