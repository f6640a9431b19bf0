"""Context-parallel attention over a load-balanced sequence (parallel.context_parallel_algo
ring, allgather or hybrid; the layout in parallel/cp_layout.py): ring rank r of R holds chunks
r and 2R-1-r of 2R (S = s/R tokens, two chunks of S/2), and its queries must attend to the keys
of every earlier position, most of which other ranks hold.

- ring: the key/value blocks travel around the ring (parallel/ring.py); at each of the R steps
  a rank attends its two query chunks to the two key chunks it holds then, skipping the pairs
  a causal mask hides entirely (a later key chunk), masking only the diagonal (the same chunk),
  and merging the partial results through their log-sum-exp (model/block_attention.py). With
  the load balance every rank computes the same number of pairs at every step.
- allgather: one all-gather of the key/value heads of the whole sequence (backward: one
  reduce-scatter of their gradients); each query chunk then attends to the keys up to its end
  with its causal offset. Cheaper than R ring steps when key/value heads are few (GQA).
- hybrid: Ulysses' head exchange (parallel/ulysses.py) over groups of U ranks first, so the
  ring (or nothing else) sees [S, b, n/U, d] of its ring rank's tokens, then the ring across.

Packed documents (data.reset_attention_mask): every rank holds the whole sequence's document
indices, so each (query chunk, key chunk) block is also masked where the documents differ
(hidden_keys); a block may hide every key from a query row (0 out, lse -inf), which the merge
carries (merge(masked=True)) until the diagonal block. data.reset_position_ids: rotary at each
sample's places at the ring rank's tokens. model.attention.sliding_window: each block is masked
where a query is a window or more past a key (hidden_keys), and a pair whose every query is
(_pairs) is not computed.

Backward of the ring: without attention dropout, an explicit one (_RingAttention) keeps only
q, k, v, the output and the log-sum-exp of each query row; it passes the key/value blocks
around the ring again, each with the gradient of its keys and values accumulating as it
travels, recomputes each pair's probabilities from the saved log-sum-exp
(block_attention_backward) and, after the last step, one more pass hands every block's gradient
to its owner. With attention dropout the forward runs in autograd-able pieces instead (the ring
shift's backward sends the gradient back along the ring), which keeps every step's key/value
block and scores: the masks would otherwise have to be replayed. The all-gather's backward
reduce-scatters (autograd)."""
from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from megatron.config import ModelConfig, variants
from megatron.model.block_attention import block_attention, block_attention_backward, merge
from megatron.model import rotary
from megatron.model.context import ModelContext, documents_of
from megatron.parallel import cp_layout, ulysses
from megatron.parallel.mappings import gather_from_sequence_parallel_region
from megatron.parallel.ring import ring_pass, ring_shift

log = logging.getLogger(__name__)


def chunks_of(ring_rank: int, ring: int):
    """The two chunk indices (of 2R) ring rank r holds: an early and a late one."""
    return ring_rank, 2 * ring - 1 - ring_rank


def _pairs(ring_rank: int, ring: int, step: int, window: Optional[int] = None, half: int = 0):
    """(query chunk i of mine, key chunk j of the block held at `step`, causal offset) of every
    pair a causal mask does not hide entirely, nor a sliding window (every query of chunk i at
    least `window` past every key of chunk j: (qc - kc - 1) x half + 1 >= window)."""
    theirs = chunks_of((ring_rank - step) % ring, ring)
    for i, qc in enumerate(chunks_of(ring_rank, ring)):
        for j, kc in enumerate(theirs):
            if kc <= qc and not (window and (qc - kc - 1) * half + 1 >= window):
                yield i, j, (0 if kc == qc else None)


_HIDDEN = [None, {}]  # (a document index tensor, its masks by block): one micro-batch's


def hidden_keys(doc: Optional[torch.Tensor], queries: slice, keys: slice,
                window: Optional[int] = None, device=None):
    """[b or 1, 1, sq, sk] bool, True where a query of the positions `queries` may not see a key
    of the positions `keys`: another document (doc [b, s], each token's document index over
    the whole sequence, model/context.Documents) or outside the window (a query i sees keys
    j > i - window: model.attention.sliding_window); the causal part is block_attention's
    offset. None where neither is set. Made once per micro-batch, window and block pair: every
    layer (and its recomputation, and the ring's backward) gets the same documents tensor."""
    if doc is None and window is None:
        return None
    if _HIDDEN[0] is not doc:
        _HIDDEN[:] = [doc, {}]
    key = (queries.start, queries.stop, keys.start, keys.stop, window, str(device))
    if key not in _HIDDEN[1]:
        hidden = None
        if window is not None:
            at = doc.device if doc is not None else device
            rows = torch.arange(queries.start, queries.stop, device=at).unsqueeze(1)
            cols = torch.arange(keys.start, keys.stop, device=at).unsqueeze(0)
            hidden = (rows - cols >= window).view(1, 1, rows.shape[0], cols.shape[1])
        if doc is not None:
            other = (doc[:, queries].unsqueeze(2) != doc[:, keys].unsqueeze(1)).unsqueeze(1)
            hidden = other if hidden is None else other | hidden
        _HIDDEN[1][key] = hidden
    return _HIDDEN[1][key]


def _chunk(c: int, half: int) -> slice:
    """The sequence positions of chunk c (of 2R, each `half` tokens)."""
    return slice(c * half, (c + 1) * half)


def _pair_hidden(doc, ring_rank: int, ring: int, step: int, i: int, j: int, half: int,
                 window: Optional[int] = None, device=None):
    """hidden_keys of my query chunk i against key chunk j of the block held at `step`."""
    if doc is None and window is None:
        return None
    qc = chunks_of(ring_rank, ring)[i]
    kc = chunks_of((ring_rank - step) % ring, ring)[j]
    return hidden_keys(doc, _chunk(qc, half), _chunk(kc, half), window, device)


class _RingAttention(torch.autograd.Function):
    """Ring attention without dropout, with the explicit backward the module docstring names.
    doc: the whole sequence's document indices [b, s] (data.reset_attention_mask) or None."""

    @staticmethod
    def forward(ctx, q, k, v, group, ring_rank: int, ring: int, doc=None, window=None,
                cap: float = 0.0):
        half, g = q.shape[0] // 2, k.shape[2]
        q_parts, kv, acc = q.split(half), torch.cat([k, v], dim=2), [None, None]
        masked = doc is not None or window is not None
        for step in range(ring):
            if step:
                kv = ring_pass(kv, group)
            k_parts, v_parts = (t.split(half) for t in kv.split(g, dim=2))
            for i, j, offset in _pairs(ring_rank, ring, step, window, half):
                hidden = _pair_hidden(doc, ring_rank, ring, step, i, j, half, window, q.device)
                part = block_attention(q_parts[i], k_parts[j], v_parts[j], offset, None, hidden,
                                       cap)
                acc[i] = part if acc[i] is None else merge(*acc[i], *part, masked=masked)
        out, lse = torch.cat([acc[0][0], acc[1][0]]), torch.cat([acc[0][1], acc[1][1]])
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.ring_rank, ctx.ring, ctx.doc = group, ring_rank, ring, doc
        ctx.window, ctx.cap = window, cap
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring, half, g = ctx.ring, q.shape[0] // 2, k.shape[2]
        dout = dout.float()
        delta = (dout * out).sum(-1)  # [S, b, n]
        dq = torch.zeros_like(out)
        kv, dkv = torch.cat([k, v], dim=2), torch.zeros(k.shape[:2] + (2 * g, k.shape[3]),
                                                        dtype=torch.float32, device=k.device)
        rows = [slice(0, half), slice(half, 2 * half)]
        for step in range(ring):
            if step:  # the block and the gradient it has gathered so far move on together
                kv, dkv = ring_pass(kv, ctx.group), ring_pass(dkv, ctx.group)
            keys, values = kv.split(g, dim=2)
            for i, j, offset in _pairs(ctx.ring_rank, ring, step, ctx.window, half):
                qi, kj = rows[i], rows[j]
                hidden = _pair_hidden(ctx.doc, ctx.ring_rank, ring, step, i, j, half, ctx.window,
                                      q.device)
                gq, gk, gv = block_attention_backward(q[qi], keys[kj], values[kj], dout[qi],
                                                      lse[qi], delta[qi], offset, hidden,
                                                      ctx.cap)
                dq[qi] += gq
                dkv[kj, :, :g] += gk
                dkv[kj, :, g:] += gv
        if ring > 1:  # the last block held is the next rank's: hand each its gradient
            dkv = ring_pass(dkv, ctx.group)
        dk, dv = dkv.split(g, dim=2)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None


def ring_attention(q, k, v, group, ring_rank: int, ring: int, drop=None, doc=None,
                   window=None, cap: float = 0.0) -> torch.Tensor:
    """q [S, b, n, d], k and v [S, b, g, d] of this ring rank's two chunks -> [S, b, n, d].
    doc: the whole sequence's document indices [b, s] to attend within, or None; window: the
    layer's sliding window (model.attention.sliding_window), or None; cap: the scores' cap
    (model.attention.logit_softcapping; 0: none)."""
    if drop is None:
        return _RingAttention.apply(q, k, v, group, ring_rank, ring, doc, window, cap)
    half, g = q.shape[0] // 2, k.shape[2]
    q_parts = q.split(half)
    acc = [None, None]  # per query chunk: (out, lse) over the keys seen so far
    kv = torch.cat([k, v], dim=2)  # one message a step: [S, b, 2g, d]
    for step in range(ring):
        if step:
            kv = ring_shift(kv, group)  # now the block of ring rank (ring_rank - step) % R
        k_parts, v_parts = (t.split(half) for t in kv.split(g, dim=2))
        for i, j, offset in _pairs(ring_rank, ring, step, window, half):
            hidden = _pair_hidden(doc, ring_rank, ring, step, i, j, half, window, q.device)
            part = block_attention(q_parts[i], k_parts[j], v_parts[j], offset, drop, hidden,
                                   cap)
            acc[i] = part if acc[i] is None else merge(
                *acc[i], *part, masked=doc is not None or window is not None)
    return torch.cat([acc[0][0], acc[1][0]]).to(q.dtype)


def allgather_attention(q, k, v, group, ring_rank: int, ring: int, drop=None, doc=None,
                        window=None, cap: float = 0.0) -> torch.Tensor:
    """As ring_attention, with every key/value gathered once instead of passed around."""
    seq, half, g = q.shape[0] * ring, q.shape[0] // 2, k.shape[2]
    kv = gather_from_sequence_parallel_region(torch.cat([k, v], dim=2), group)  # [s, b, 2g, d]
    held = torch.cat([cp_layout.ring_positions(seq, r, ring, q.device) for r in range(ring)])
    kv = kv.index_select(0, torch.argsort(held))  # rows in sequence order
    keys, values = kv.split(g, dim=2)
    outs = []
    for i, qc in enumerate(chunks_of(ring_rank, ring)):
        end = (qc + 1) * half  # this chunk's queries see keys [0, end)
        hidden = hidden_keys(doc, _chunk(qc, half), slice(0, end), window, q.device)
        outs.append(block_attention(q[i * half:(i + 1) * half], keys[:end], values[:end],
                                    qc * half, drop, hidden, cap)[0])
    return torch.cat(outs).to(q.dtype)


_PLACES = [None, None]  # (a positions tensor, the ring rank's rows of it): one micro-batch's


def _ring_places(positions: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """positions [b, s] over the whole sequence -> [b, S] at the ring rank's tokens `at`: the
    same tensor for every layer of a micro-batch (the rotary tables are gathered once for it,
    rotary.apply_per_sample)."""
    if _PLACES[0] is not positions:
        _PLACES[:] = [positions, positions.index_select(1, at.to(positions.device))]
    return _PLACES[1]


ALGORITHMS = {"ring": ring_attention, "hybrid": ring_attention, "allgather": allgather_attention}


class ContextAttention(nn.Module):
    """q [s/C, b, n, d], k and v [s/C, b, g, d] (this rank's tokens, its TP heads) ->
    [s/C, b, n*d]: the whole causal attention over the sequence, rotary positions included."""

    def __init__(self, m: ModelConfig, ctx: ModelContext, groups_local: int, q_per_group: int,
                 layer_number: int = 0):
        super().__init__()
        state = ctx.state
        self.layout, self.sel, self.tracker = state.cp_layout, ctx.sel, ctx.tracker
        self.dropout = m.attention_dropout
        self.ring_group, self.ring_rank = cp_layout.ring_group(state), cp_layout.ring_rank(state)
        self.ulysses_group = cp_layout.ulysses_group(state)
        self.kv_replicas = ulysses.kv_replicas(groups_local, q_per_group, self.layout.ulysses)
        self.rotary = rotary.for_layer(m, layer_number)
        docs = ctx.documents  # data.reset_attention_mask / reset_position_ids (model/context.py)
        self.attend_within = docs is not None and docs.attend_within
        self.reset_positions = docs is not None and docs.reset_positions
        self.window = m.attention.window_of(layer_number)  # model.attention.sliding_window
        self.cap = m.attention.logit_softcapping  # 0: none
        self.attend = ALGORITHMS[self.layout.algo]
        if not variants.get("attention", ctx.backend).keeps_scores:
            log.info("context_parallel_algo=%s attends block by block with the math path "
                     "(model/block_attention.py), not the %s core", self.layout.algo, ctx.backend)

    def _drop(self, probs: torch.Tensor) -> torch.Tensor:
        with self.tracker.fork("tp"):
            return F.dropout(probs, self.dropout, True)

    def _rotate(self, q, k, seq: int, docs):
        """Rotary at the ring rank's tokens' global positions, or (data.reset_position_ids)
        at each sample's places in its documents, the whole sequence's tables."""
        at = cp_layout.ring_positions(seq, self.ring_rank, self.layout.ring, q.device)
        if not self.reset_positions:
            return self.rotary.apply_at(q, at, self.sel), self.rotary.apply_at(k, at, self.sel)
        places = _ring_places(documents_of(docs, "reset_position_ids")[1], at)
        return (self.rotary.apply_per_sample(q, places, self.sel, seq),
                self.rotary.apply_per_sample(k, places, self.sel, seq))

    def forward(self, q, k, v, docs: Optional[torch.Tensor] = None) -> torch.Tensor:
        """docs: the micro-batch's documents over the whole sequence (model/context.py)."""
        u, ring = self.layout.ulysses, self.layout.ring
        if u > 1:  # [s/C, b, n, d] -> [s/R, b, n/U, d]: the ring rank's tokens
            q, k, v = ulysses.scatter_heads(q, k, v, self.ulysses_group, u, self.kv_replicas)
        seq_r, b = q.shape[:2]
        if self.rotary is not None:
            q, k = self._rotate(q, k, seq_r * ring, docs)
        drop = self._drop if self.training and self.dropout > 0 else None
        doc = documents_of(docs, "reset_attention_mask")[0] if self.attend_within else None
        out = self.attend(q, k, v, self.ring_group, self.ring_rank, ring, drop, doc, self.window,
                          self.cap)
        out = out.reshape(seq_r, b, -1)  # [s/R, b, n/U*d]
        return ulysses.gather_heads(out, self.ulysses_group, u) if u > 1 else out
