"""Rotary position embedding (rotate-half convention over the whole head dimension)."""
from __future__ import annotations

import torch

from megatron import kernels


class RotaryEmbedding:
    """Caches cos/sin tables [s, 1, 1, d] in fp32 per device."""

    def __init__(self, head_dim: int, base: float, max_seq: int):
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        freqs = torch.outer(torch.arange(max_seq, dtype=torch.float64), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)  # [s, d]
        self._cos = emb.cos().float()[:, None, None, :]
        self._sin = emb.sin().float()[:, None, None, :]
        self._cache = {}

    def tables(self, seq: int, device: torch.device):
        key = (seq, device)
        if key not in self._cache:
            self._cache[key] = (self._cos[:seq].to(device), self._sin[:seq].to(device))
        return self._cache[key]

    def apply(self, x: torch.Tensor, sel) -> torch.Tensor:
        """x [s, b, n, d]."""
        cos, sin = self.tables(x.shape[0], x.device)
        return kernels.rotary(x, cos, sin, sel)

    def apply_at(self, x: torch.Tensor, positions: torch.Tensor, sel) -> torch.Tensor:
        """x [s, b, n, d] at global positions [s] (a context-parallel rank's load-balanced
        tokens, parallel/cp_layout.py)."""
        cos = self._cos.index_select(0, positions.cpu()).to(x.device)
        sin = self._sin.index_select(0, positions.cpu()).to(x.device)
        return kernels.rotary(x, cos, sin, sel)


def for_model(m) -> RotaryEmbedding:
    """model.position_embedding_type=rotary (config/builtin_variants.py)."""
    return RotaryEmbedding(m.head_dim, m.rotary_base, m.max_position_embeddings)
