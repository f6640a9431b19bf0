"""A generated token stream for throughput work and tests without data.

Sample i is a pure function of (seed, i), so every parallel layout sees the same global batch and
a resumed run continues the exact stream. The tokens follow a fixed random bigram chain, so the
loss falls as the model learns the chain (a constant or uniform stream would not show learning)."""
from __future__ import annotations

import numpy as np


class SyntheticTokens:
    def __init__(self, vocab_size: int, seq_length: int, seed: int, branching: int = 4):
        self.vocab_size, self.seq_length, self.seed = vocab_size, seq_length, seed
        rng = np.random.default_rng(seed)
        # Each token may be followed by one of `branching` successors.
        self.successors = rng.integers(0, vocab_size, size=(vocab_size, branching))

    def sample(self, index: int) -> np.ndarray:
        """seq_length + 1 tokens: inputs are [:-1], labels are [1:]."""
        rng = np.random.default_rng([self.seed, index])
        choices = rng.integers(0, self.successors.shape[1], size=self.seq_length)
        out = np.empty(self.seq_length + 1, dtype=np.int64)
        out[0] = rng.integers(0, self.vocab_size)
        for t in range(self.seq_length):
            out[t + 1] = self.successors[out[t], choices[t]]
        return out

    def __len__(self) -> int:
        return 2 ** 62
