"""Micro-batch iterators over a sample source, sliced for one data-parallel rank.

Global step k consumes samples [k*G, (k+1)*G) of the source (G = global batch). Micro-batch j of
data-parallel rank r takes the mb samples starting at k*G + (j*dp + r)*mb, so the union over ranks
and micro-batches is the same set for every layout and resuming from a consumed-sample count
continues the stream exactly. Under a batch-size ramp (training.rampup_batch_size) a step's G is
the ramp's at the samples consumed before it, and the step starts there."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Tuple

import numpy as np
import torch

Batch = Tuple[torch.Tensor, torch.Tensor]  # tokens [mb, s], labels [mb, s], int64

# A label the loss does not count (model/gpt.counted_mean counts the non-negative ones).
IGNORED_LABEL = -1


@dataclass
class DataIterators:
    train: Iterator[Batch]
    # A fresh iterator over the validation samples, or None when there is no validation split.
    valid: Callable[[], Iterator[Batch]] | None
    vocab_size: int  # unpadded; the model pads it
    # Like valid, over the test split; evaluated once after training. None without a test split.
    test: Callable[[], Iterator[Batch]] | None = None


def micro_batches(sample_fn: Callable[[int], np.ndarray], num_samples: int, start: int,
                  micro_batch: int, global_batch: int, dp_rank: int, dp_size: int,
                  wrap: bool = True, eod: Optional[int] = None,
                  batch_at: Optional[Callable[[int], int]] = None) -> Iterator[Batch]:
    """eod: where an input token is this end-of-document id, its label (the next document's
    first token, predicted from the one before) is IGNORED_LABEL (data.eod_mask_loss).
    batch_at: the global batch of the step after a number of consumed samples (a ramp's,
    TrainingConfig.global_batch_at); None: global_batch every step."""
    consumed = start
    while True:
        if batch_at is not None:
            global_batch = batch_at(consumed)
        for j in range(global_batch // (micro_batch * dp_size)):
            first = consumed + (j * dp_size + dp_rank) * micro_batch
            idx = [(first + i) % num_samples if wrap else first + i for i in range(micro_batch)]
            if not wrap and idx[-1] >= num_samples:
                return
            rows = np.stack([sample_fn(i) for i in idx])
            data = torch.from_numpy(rows)
            tokens, labels = data[:, :-1].contiguous(), data[:, 1:].contiguous()
            if eod is not None:
                labels[tokens == eod] = IGNORED_LABEL
            yield tokens, labels
        consumed += global_batch
