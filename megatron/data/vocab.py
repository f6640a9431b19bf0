"""Vocabulary padding, as Megatron does: a multiple of make_vocab_size_divisible_by x TP so each
tensor-parallel rank holds an equal, GEMM-friendly slice of the embedding."""
from __future__ import annotations

import logging

from megatron.config import model_math

log = logging.getLogger(__name__)


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    """config.model_math's rule, logged when it pads."""
    padded = model_math.padded_vocab_size(vocab_size, divisible_by, tp)
    if padded != vocab_size:
        log.info("vocabulary padded from %d to %d (%d dummy tokens, a multiple of %d x TP %d)",
                 vocab_size, padded, padded - vocab_size, divisible_by, tp)
    return padded
