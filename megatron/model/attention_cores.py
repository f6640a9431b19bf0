"""The built-in attention cores (model.attention_backend; records in config/builtin_variants.py):
q [s, b, n, d], k and v [s, b, kv, d] of this rank's heads -> context [s, b, n*d], causal, within
the layer's sliding window where model.attention sets one (Variant.sliding_window: all three).

flash: flash-attn on a GPU; sdpa: torch scaled_dot_product_attention; math: explicit scores
with the fused scaled causal softmax (keeps the s x s probabilities for backward). A core takes
(model section, context, layer number); one with weights declares them in its record. Context
parallelism and rotary positions wrap every core alike (attention.SelfAttention).

Under a sliding window or packed documents sdpa and math attend in bands when the sequence spans
more than two blocks of max(window, BAND_BLOCK) queries (attention_bands): each block of queries
against the keys its window, and its first query's document, reach, so scores, masks and saved
probabilities take about s x (block + window) in place of s x s, and so does the time
(benchmarks/results/attention_band.md)."""
from __future__ import annotations

import contextlib
import math
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from megatron import kernels
from megatron.config import ModelConfig
from megatron.config import model_math
from megatron.model.context import ModelContext, document_starts
from megatron.model.softcap import softcapped


def flash_attn_func_or_none():
    try:
        from flash_attn import flash_attn_func
        return flash_attn_func
    except Exception:  # ImportError, or a binary built for another torch/GPU
        return None


def flash_available(device_type: str, precision: str) -> bool:
    return device_type == "cuda" and precision in ("bf16", "fp16") and \
        flash_attn_func_or_none() is not None


class _Core(nn.Module):
    def __init__(self, m: ModelConfig, ctx: ModelContext, layer_number: int):
        super().__init__()
        self.dropout, self.tracker, self.sel = m.attention_dropout, ctx.tracker, ctx.sel
        # model.attention.sliding_window: the keys this layer's queries see (None: all earlier)
        self.window = m.attention.window_of(layer_number)
        # model.attention.logit_softcapping (0: none); a core whose record has softcapping=True
        # applies it
        self.softcap = m.attention.logit_softcapping

    def p(self) -> float:
        return self.dropout if self.training else 0.0

    def dropout_stream(self):
        """The sharded ("tp") random stream for the kernel's dropout; none without dropout, where
        the kernel draws nothing (saves four generator-state copies a layer and step)."""
        return self.tracker.fork("tp") if self.p() > 0 else contextlib.nullcontext()


class FlashCore(_Core):
    def forward(self, q, k, v) -> torch.Tensor:
        s, b, n, d = q.shape
        # flash-attn's window (left, right) counts the keys beside the query's own
        window = (self.window - 1, 0) if self.window else (-1, -1)
        # flash-attn 2.6's softcap: tanh-capped scores inside the kernel (passed only when set,
        # so an older flash-attn still runs every model without a cap)
        capped = {"softcap": self.softcap} if self.softcap else {}
        with self.dropout_stream():
            out = flash_attn_func_or_none()(q.transpose(0, 1), k.transpose(0, 1),
                                            v.transpose(0, 1), dropout_p=self.p(),
                                            causal=True, window_size=window,
                                            **capped)  # [b, s, n, d]
        return out.transpose(0, 1).reshape(s, b, n * d)


_MASKS = [None, {}]  # (the documents tensor, its masks by window): one micro-batch's, all layers

Block = Tuple[int, int, int]  # queries [q0, q1), keys [k0, q1)


def _memo(documents: Optional[torch.Tensor]) -> dict:
    if _MASKS[0] is not documents:
        _MASKS[:] = [documents, {}]
    return _MASKS[1]


def attention_bands(s: int, window: Optional[int], documents: Optional[torch.Tensor]
                    ) -> Optional[List[Block]]:
    """The bands the sdpa and math cores attend a layer in (None: the whole sequence at once):
    a sliding window's (config/model_math.band_blocks) and, with packed documents (documents
    [b, s], each token's document index, non-decreasing), blocks of max(window, BAND_BLOCK)
    queries whose keys start no earlier than the first query's document (the earliest over
    the micro-batch's samples), so short documents cost what they hold. Made once per
    micro-batch and window (one host sync for the documents' starts)."""
    bands = model_math.band_blocks(s, window, packed=documents is not None)
    if documents is None or bands is None:
        return bands
    memo, key = _memo(documents), ("bands", window, s)
    if key not in memo:
        firsts = [q0 for q0, _, _ in bands]
        starts = document_starts(documents)[:, firsts].min(dim=0).values.tolist()
        memo[key] = [(q0, q1, max(k0, start)) for (q0, q1, k0), start in zip(bands, starts)]
    return memo[key]


def visible_keys(documents: Optional[torch.Tensor], window: Optional[int], s: int,
                 device: torch.device, band: Optional[Block] = None) -> torch.Tensor:
    """[b or 1, 1, s, s] bool, True where query i may attend key j: j <= i, within the window
    (i - window < j; model.attention.sliding_window) and of the same document (documents
    [b, s], each token's document index: data.reset_attention_mask); for a band (q0, q1, k0)
    the [.., q1 - q0, q1 - k0] part of queries q0.. against keys k0... Made once per
    micro-batch and window: every layer (and its recomputation) gets the same documents
    tensor."""
    memo = _memo(documents)
    q0, q1, k0 = band or (0, s, 0)
    key = (window, s, str(device), q0, q1, k0)
    if key not in memo:
        query = torch.arange(q0, q1, device=device).unsqueeze(1)
        keys = torch.arange(k0, q1, device=device).unsqueeze(0)
        mask = keys <= query
        if window:
            mask &= query - keys < window
        mask = mask.view(1, 1, q1 - q0, q1 - k0)
        if documents is not None:
            mask = (documents[:, q0:q1].unsqueeze(2)
                    == documents[:, k0:q1].unsqueeze(1)).unsqueeze(1) & mask
        memo[key] = mask
    return memo[key]


def _in_bands(attend, s: int, window: Optional[int], documents: Optional[torch.Tensor],
              device: torch.device, dim: int) -> torch.Tensor:
    """attend(q0, q1, k0, visible) over the layer's bands (attention_bands; the whole sequence
    as one where there are none), the outputs joined along the query dimension `dim`."""
    parts = [attend(q0, q1, k0, visible_keys(documents, window, s, device, (q0, q1, k0)))
             for q0, q1, k0 in attention_bands(s, window, documents) or [(0, s, 0)]]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


class SdpaCore(_Core):
    def forward(self, q, k, v, documents=None) -> torch.Tensor:
        s, b, n, d = q.shape
        qt, kt, vt = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # [b, heads, s, d]
        with self.dropout_stream():
            if documents is None and self.window is None:
                out = self._attend(qt, kt, vt, None)
            else:
                out = _in_bands(lambda q0, q1, k0, visible: self._attend(
                    qt[:, :, q0:q1], kt[:, :, k0:q1], vt[:, :, k0:q1], visible),
                    s, self.window, documents, q.device, dim=2)
        return out.permute(2, 0, 1, 3).reshape(s, b, n * d)

    def _attend(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.p(),
                                              is_causal=mask is None,
                                              enable_gqa=q.shape[1] > k.shape[1])


class MathCore(_Core):
    def forward(self, q, k, v, documents=None) -> torch.Tensor:
        s, b, n, d = q.shape
        if n > k.shape[2]:
            rep = n // k.shape[2]
            k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        qb = q.permute(1, 2, 0, 3).reshape(b * n, s, d)
        kb = k.permute(1, 2, 3, 0).reshape(b * n, d, s)
        vb = v.permute(1, 2, 0, 3).reshape(b * n, s, d)
        if documents is None and self.window is None:
            scores, scale = self._capped(torch.bmm(qb, kb), d)
            probs = kernels.scaled_causal_softmax(scores, scale, self.sel)
            out = torch.bmm(self._dropout(probs), vb)  # [b*n, s, d]
        else:
            out = _in_bands(lambda q0, q1, k0, visible: self._masked(
                qb[:, q0:q1], kb[:, :, k0:q1], vb[:, k0:q1], b, visible),
                s, self.window, documents, q.device, dim=1)
        return out.view(b, n, s, d).permute(2, 0, 1, 3).reshape(s, b, n * d)

    def _masked(self, qb, kb, vb, b: int, visible: torch.Tensor) -> torch.Tensor:
        """Queries [b*n, q, d] against keys [b*n, d, k] where `visible` ([b or 1, 1, q, k]):
        the masked softmax takes [b, n, q, k] and True where a key is masked out."""
        rows, cols = qb.shape[1], kb.shape[2]
        scores, scale = self._capped(torch.bmm(qb, kb), qb.shape[2])
        probs = kernels.scaled_masked_softmax(scores.view(b, -1, rows, cols),
                                              visible.logical_not(), scale,
                                              self.sel).view(-1, rows, cols)
        return torch.bmm(self._dropout(probs), vb)

    def _capped(self, scores: torch.Tensor, d: int) -> Tuple[torch.Tensor, float]:
        """(the scores, the softmax's scale): q.k and 1/sqrt(d), or with a cap (model.attention
        .logit_softcapping) cap x tanh(q.k / sqrt(d) / cap) and 1, as Gemma 2 caps them after
        their scale and before the mask."""
        if not self.softcap:
            return scores, 1.0 / math.sqrt(d)
        return softcapped(scores, self.softcap, 1.0 / math.sqrt(d)), 1.0

    def _dropout(self, probs: torch.Tensor) -> torch.Tensor:
        if self.training and self.dropout > 0:
            with self.tracker.fork("tp"):
                probs = F.dropout(probs, self.dropout, True)
        return probs
