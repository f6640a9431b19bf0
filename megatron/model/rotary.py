"""Rotary position embedding (rotate-half convention over the whole head dimension), its
frequencies optionally stretched for a longer context (model.rope_scaling: linear, llama3)."""
from __future__ import annotations

import math
from typing import Optional

import torch

from megatron import kernels
from megatron.config import variants


# (positions, the frequencies, cos, sin) of the last per-sample tables: one micro-batch's
_PER_SAMPLE = [None, None, None, None]


class RotaryEmbedding:
    """Caches cos/sin tables [s, 1, 1, d] in fp32 per device."""

    def __init__(self, head_dim: int, base: float, max_seq: int, scaling=None):
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        inv_freq = scaled_frequencies(inv_freq, scaling)
        self._inv_freq = inv_freq  # what tells two layers' tables apart (_PER_SAMPLE)
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

    def apply_per_sample(self, x: torch.Tensor, positions: torch.Tensor, sel,
                         seq: Optional[int] = None) -> torch.Tensor:
        """x [s, b, n, d] at positions [b, s] of each sample's own (data.reset_position_ids):
        tables [s, b, 1, d], which the fused kernel does not take (one [s, d] table), so the
        torch path rotates. The tables are gathered on x's device, once for the queries and
        keys of every layer given the same positions. seq: the whole sequence's length, where
        x holds a context-parallel rank's share of it (default: x's)."""
        if not (_PER_SAMPLE[0] is positions and torch.equal(_PER_SAMPLE[1], self._inv_freq)
                and _PER_SAMPLE[2].device == x.device):
            # a place in a document is below the whole sequence's length
            cos, sin = self.tables(seq or x.shape[0], x.device)
            at = positions.t().to(x.device)
            _PER_SAMPLE[:] = [positions, self._inv_freq, cos[:, 0, 0, :][at].unsqueeze(2),
                              sin[:, 0, 0, :][at].unsqueeze(2)]
        return kernels.rotary(x, _PER_SAMPLE[2], _PER_SAMPLE[3], sel)


def scaled_frequencies(inv_freq: torch.Tensor, scaling: Optional[object]) -> torch.Tensor:
    """Each channel pair's angular frequency under model.rope_scaling. linear: all divided by
    factor. llama3 (Llama 3.1's published rule): with L the original context, a pair whose
    wavelength 2 pi / f is below L / high_freq_factor keeps f, above L / low_freq_factor takes
    f / factor, and between them takes the blend (1 - a) f / factor + a f, where
    a = (L / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)."""
    if scaling is None or scaling.type == "none":
        return inv_freq
    if scaling.type == "linear":
        return inv_freq / scaling.factor
    if scaling.type != "llama3":
        raise ValueError(f"model.rope_scaling.type={scaling.type!r}: expected none, linear or "
                         f"llama3")
    original, low, high = (scaling.original_max_position_embeddings, scaling.low_freq_factor,
                           scaling.high_freq_factor)
    wavelength = 2 * math.pi / inv_freq
    blend = (original / wavelength - low) / (high - low)
    mixed = (1 - blend) * inv_freq / scaling.factor + blend * inv_freq
    out = torch.where(wavelength > original / low, inv_freq / scaling.factor, mixed)
    return torch.where(wavelength < original / high, inv_freq, out)


def for_model(m) -> RotaryEmbedding:
    """model.position_embedding_type=rotary (config/builtin_variants.py)."""
    return RotaryEmbedding(m.head_dim, m.rotary_base, m.max_position_embeddings, m.rope_scaling)


def for_layer(m, layer_number: int):
    """The rotation of layer `layer_number` (0-based): None where the position variant rotates
    no q and k; a layer within a sliding window rotates with model.attention.window_rotary_base
    and no scaling where that is set (Gemma 3's local layers), every other layer as the variant
    builds it."""
    position = variants.of(m, "position")
    if not position.rotates_qk:
        return None
    base = m.attention.window_rotary_base
    if base is not None and m.attention.window_of(layer_number) is not None:
        return RotaryEmbedding(m.head_dim, base, m.max_position_embeddings)
    return position.build(m)
