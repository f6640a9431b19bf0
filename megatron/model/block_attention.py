"""Attention of a query block to one key/value block, returning the log-sum-exp of each query
row with the output, and the merge of such partial results: the inner computation of the
context-parallel wrappers (model/context_attention.py), which see the sequence one block at a
time.

For query i, keys j of a block: lse_i = log sum_j exp(s_ij), o_i = sum_j exp(s_ij - lse_i) v_j.
Two blocks' results (o1, lse1), (o2, lse2) merge exactly into those of the union:
lse = logaddexp(lse1, lse2), o = exp(lse1 - lse) o1 + exp(lse2 - lse) o2.

Math path only (explicit scores, mask, logsumexp, in fp32): correct on every device and the
reference. block_attention_backward is the block's backward given the final log-sum-exp, what
ring attention's explicit backward (model/context_attention.py) recomputes block by block.
Scores may be capped (model.attention.logit_softcapping: cap x tanh(s / cap) before the masks),
the backward then passing the tanh's derivative on. Seam for a GPU: flash-attn's
flash_attn_func(..., return_attn_probs=True) returns the same lse per row (its softmax_lse,
[b, n, s]); a `block_attention` that calls it for offset in (None, 0) (causal=False /
causal=True) would slot in below, untested here."""
from __future__ import annotations

import math
from typing import Callable, Optional, Tuple

import torch

from megatron.model.softcap import softcapped


def _capped_scores(q, k, cap: float) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(scaled fp32 scores [b, n, sq, sk] of q [sq, b, n, d] against k [sk, b, n, d], capped at
    cap x tanh(score / cap) where cap > 0 (model.attention.logit_softcapping); the tanh, which
    the explicit backward's chain rule reads, or None without a cap)."""
    scores = softcapped(torch.einsum("ibnd,jbnd->bnij", q.float(), k.float()), cap,
                        1.0 / math.sqrt(q.shape[3]))
    return scores, (scores / cap if cap else None)


def _masked_scores(q, k, offset: Optional[int], hidden: Optional[torch.Tensor],
                   cap: float = 0.0, scores: Optional[torch.Tensor] = None):
    """Scaled (and capped) fp32 scores [b, n, sq, sk] of q [sq, b, n, d] against k [sk, b, n,
    d], -inf where the causal offset or the mask `hidden` (documents, a sliding window) hides a
    key; `scores`: _capped_scores' already."""
    sq = q.shape[0]
    if scores is None:
        scores = _capped_scores(q, k, cap)[0]
    if offset is not None:
        rows = torch.arange(sq, device=q.device).unsqueeze(1)
        cols = torch.arange(k.shape[0], device=q.device).unsqueeze(0)
        scores = scores.masked_fill(cols > rows + offset, float("-inf"))  # [sq, sk] causal
    if hidden is not None:
        scores = scores.masked_fill(hidden, float("-inf"))
    return scores


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offset: Optional[int],
                    drop: Optional[Callable] = None, hidden: Optional[torch.Tensor] = None,
                    cap: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """q [sq, b, n, d], k and v [sk, b, g, d] (g divides n: grouped-query attention) ->
    out [sq, b, n, d] fp32, lse [sq, b, n] fp32. offset: None, every key visible; else query
    i sees key j iff j <= i + offset (the query block starts `offset` positions after the key
    block). hidden: [b or 1, 1, sq, sk] bool, True where a key is also hidden (another
    document, data.reset_attention_mask; outside the sliding window, model.attention;
    context_attention.hidden_keys). Without it every query row sees at least one key (the callers'
    chunks guarantee it); with it a row may see none: its output is 0 and its lse -inf, which
    merge(..., masked=True) takes. drop: dropout on the probabilities. cap: each score capped
    at cap x tanh(score / cap) before the masks (model.attention.logit_softcapping; 0: none)."""
    n = q.shape[2]
    k, v = _expand(k, n), _expand(v, n)  # each key/value head serves n/g query heads
    scores = _masked_scores(q, k, offset, hidden, cap)
    lse = torch.logsumexp(scores, dim=-1)  # [b, n, sq]
    if hidden is None:
        probs = torch.exp(scores - lse.unsqueeze(-1))
    else:  # a row that sees no key: exp(-inf - 0) = 0, not exp(-inf + inf) = nan
        probs = torch.exp(scores - lse.masked_fill(lse == float("-inf"), 0.0).unsqueeze(-1))
    if drop is not None:
        probs = drop(probs)
    out = torch.einsum("bnij,jbnd->ibnd", probs, v.float())
    return out, lse.permute(2, 0, 1)


def _expand(t: torch.Tensor, n: int) -> torch.Tensor:
    """[sk, b, g, d] -> [sk, b, n, d]: each key/value head serves n/g consecutive query heads."""
    return t.repeat_interleave(n // t.shape[2], dim=2) if n > t.shape[2] else t


def _fold(t: torch.Tensor, g: int) -> torch.Tensor:
    """The inverse sum of _expand: [sk, b, n, d] -> [sk, b, g, d]."""
    sk, b, n, d = t.shape
    return t.view(sk, b, g, n // g, d).sum(3) if n > g else t


def block_attention_backward(q, k, v, dout, lse, delta, offset: Optional[int],
                             hidden: Optional[torch.Tensor] = None, cap: float = 0.0):
    """The gradients of one block's share of an attention whose final log-sum-exp per query row
    is `lse` [sq, b, n] and whose delta_i = sum_d dout_i x out_i is `delta` [sq, b, n]:
    recomputes the block's probabilities p = exp(s - lse) (already normalised over every key
    block) and returns (dq [sq, b, n, d], dk, dv [sk, b, g, d]), fp32, scores scaled as in
    block_attention (`hidden` too). Summed over the key blocks, dq is the whole query
    gradient; summed over the query blocks, dk and dv the whole key and value gradients. Every
    row's final lse is finite (a query sees at least itself), so a hidden key's p is 0. Under
    a cap the scores' gradient passes the tanh's derivative, 1 - tanh^2, on to q.k."""
    n, d = q.shape[2], q.shape[3]
    g, scale = k.shape[2], 1.0 / math.sqrt(d)
    qf, kf, vf, do = q.float(), _expand(k, n).float(), _expand(v, n).float(), dout.float()
    capped, t = _capped_scores(qf, kf, cap)
    scores = _masked_scores(qf, kf, offset, hidden, scores=capped)
    probs = torch.exp(scores - lse.permute(1, 2, 0).unsqueeze(-1))  # [b, n, sq, sk]
    dv = torch.einsum("bnij,ibnd->jbnd", probs, do)
    dprobs = torch.einsum("ibnd,jbnd->bnij", do, vf)
    dscores = probs * (dprobs - delta.permute(1, 2, 0).unsqueeze(-1)) * scale
    if t is not None:
        dscores = dscores * (1.0 - t * t)
    dq = torch.einsum("bnij,jbnd->ibnd", dscores, kf)
    dk = torch.einsum("bnij,ibnd->jbnd", dscores, qf)
    return dq, _fold(dk, g), _fold(dv, g)


def merge(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor,
          masked: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """Two partial results over disjoint key sets -> the result over their union (exact).
    masked: a row may have seen no key in either (lse -inf in both, under a document mask or a
    sliding window):
    it stays 0 with lse -inf instead of becoming nan."""
    lse = torch.logaddexp(lse1, lse2)  # [sq, b, n]
    base = lse.masked_fill(lse == float("-inf"), 0.0) if masked else lse
    out = o1 * torch.exp(lse1 - base).unsqueeze(-1) + o2 * torch.exp(lse2 - base).unsqueeze(-1)
    return out, lse
