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

import torch
import torch.nn.functional as F
from torch import nn

from megatron.config import ModelConfig, variants
from megatron.model.block_attention import block_attention, block_attention_backward, merge
from megatron.model.context import ModelContext
from megatron.parallel import cp_layout, ulysses
from megatron.parallel.mappings import gather_from_sequence_parallel_region
from megatron.parallel.ring import ring_pass, ring_shift

log = logging.getLogger(__name__)


def chunks_of(ring_rank: int, ring: int):
    """The two chunk indices (of 2R) ring rank r holds: an early and a late one."""
    return ring_rank, 2 * ring - 1 - ring_rank


def _pairs(ring_rank: int, ring: int, step: int):
    """(query chunk i of mine, key chunk j of the block held at `step`, causal offset) of every
    pair a causal mask does not hide entirely."""
    theirs = chunks_of((ring_rank - step) % ring, ring)
    for i, qc in enumerate(chunks_of(ring_rank, ring)):
        for j, kc in enumerate(theirs):
            if kc <= qc:
                yield i, j, (0 if kc == qc else None)


class _RingAttention(torch.autograd.Function):
    """Ring attention without dropout, with the explicit backward the module docstring names."""

    @staticmethod
    def forward(ctx, q, k, v, group, ring_rank: int, ring: int):
        half, g = q.shape[0] // 2, k.shape[2]
        q_parts, kv, acc = q.split(half), torch.cat([k, v], dim=2), [None, None]
        for step in range(ring):
            if step:
                kv = ring_pass(kv, group)
            k_parts, v_parts = (t.split(half) for t in kv.split(g, dim=2))
            for i, j, offset in _pairs(ring_rank, ring, step):
                part = block_attention(q_parts[i], k_parts[j], v_parts[j], offset)
                acc[i] = part if acc[i] is None else merge(*acc[i], *part)
        out, lse = torch.cat([acc[0][0], acc[1][0]]), torch.cat([acc[0][1], acc[1][1]])
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.ring_rank, ctx.ring = group, ring_rank, ring
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
            for i, j, offset in _pairs(ctx.ring_rank, ring, step):
                qi, kj = rows[i], rows[j]
                gq, gk, gv = block_attention_backward(q[qi], keys[kj], values[kj], dout[qi],
                                                      lse[qi], delta[qi], offset)
                dq[qi] += gq
                dkv[kj, :, :g] += gk
                dkv[kj, :, g:] += gv
        if ring > 1:  # the last block held is the next rank's: hand each its gradient
            dkv = ring_pass(dkv, ctx.group)
        dk, dv = dkv.split(g, dim=2)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def ring_attention(q, k, v, group, ring_rank: int, ring: int, drop=None) -> torch.Tensor:
    """q [S, b, n, d], k and v [S, b, g, d] of this ring rank's two chunks -> [S, b, n, d]."""
    if drop is None:
        return _RingAttention.apply(q, k, v, group, ring_rank, ring)
    half, g = q.shape[0] // 2, k.shape[2]
    q_parts, mine = q.split(half), chunks_of(ring_rank, ring)
    acc = [None, None]  # per query chunk: (out, lse) over the keys seen so far
    kv = torch.cat([k, v], dim=2)  # one message a step: [S, b, 2g, d]
    for step in range(ring):
        if step:
            kv = ring_shift(kv, group)  # now the block of ring rank (ring_rank - step) % R
        theirs = chunks_of((ring_rank - step) % ring, ring)
        k_parts, v_parts = (t.split(half) for t in kv.split(g, dim=2))
        for i, qc in enumerate(mine):
            for j, kc in enumerate(theirs):
                if kc > qc:  # every key after every query: masked entirely
                    continue
                part = block_attention(q_parts[i], k_parts[j], v_parts[j],
                                       0 if kc == qc else None, drop)
                acc[i] = part if acc[i] is None else merge(*acc[i], *part)
    return torch.cat([acc[0][0], acc[1][0]]).to(q.dtype)


def allgather_attention(q, k, v, group, ring_rank: int, ring: int, drop=None) -> torch.Tensor:
    """As ring_attention, with every key/value gathered once instead of passed around."""
    seq, half, g = q.shape[0] * ring, q.shape[0] // 2, k.shape[2]
    kv = gather_from_sequence_parallel_region(torch.cat([k, v], dim=2), group)  # [s, b, 2g, d]
    held = torch.cat([cp_layout.ring_positions(seq, r, ring, q.device) for r in range(ring)])
    kv = kv.index_select(0, torch.argsort(held))  # rows in sequence order
    keys, values = kv.split(g, dim=2)
    outs = []
    for i, qc in enumerate(chunks_of(ring_rank, ring)):
        end = (qc + 1) * half  # this chunk's queries see keys [0, end)
        outs.append(block_attention(q[i * half:(i + 1) * half], keys[:end], values[:end],
                                    qc * half, drop)[0])
    return torch.cat(outs).to(q.dtype)


ALGORITHMS = {"ring": ring_attention, "hybrid": ring_attention, "allgather": allgather_attention}


class ContextAttention(nn.Module):
    """q [s/C, b, n, d], k and v [s/C, b, g, d] (this rank's tokens, its TP heads) ->
    [s/C, b, n*d]: the whole causal attention over the sequence, rotary positions included."""

    def __init__(self, m: ModelConfig, ctx: ModelContext, groups_local: int, q_per_group: int):
        super().__init__()
        state = ctx.state
        self.layout, self.sel, self.tracker = state.cp_layout, ctx.sel, ctx.tracker
        self.dropout = m.attention_dropout
        self.ring_group, self.ring_rank = cp_layout.ring_group(state), cp_layout.ring_rank(state)
        self.ulysses_group = cp_layout.ulysses_group(state)
        self.kv_replicas = ulysses.kv_replicas(groups_local, q_per_group, self.layout.ulysses)
        position = variants.of(m, "position")
        self.rotary = position.build(m) if position.rotates_qk else None
        self.attend = ALGORITHMS[self.layout.algo]
        if not variants.get("attention", ctx.backend).keeps_scores:
            log.info("context_parallel_algo=%s attends block by block with the math path "
                     "(model/block_attention.py), not the %s core", self.layout.algo, ctx.backend)

    def _drop(self, probs: torch.Tensor) -> torch.Tensor:
        with self.tracker.fork("tp"):
            return F.dropout(probs, self.dropout, True)

    def forward(self, q, k, v) -> torch.Tensor:
        u, ring = self.layout.ulysses, self.layout.ring
        if u > 1:  # [s/C, b, n, d] -> [s/R, b, n/U, d]: the ring rank's tokens
            q, k, v = ulysses.scatter_heads(q, k, v, self.ulysses_group, u, self.kv_replicas)
        seq_r, b = q.shape[:2]
        if self.rotary is not None:  # rotary at the tokens' global positions
            at = cp_layout.ring_positions(seq_r * ring, self.ring_rank, ring, q.device)
            q, k = self.rotary.apply_at(q, at, self.sel), self.rotary.apply_at(k, at, self.sel)
        drop = self._drop if self.training and self.dropout > 0 else None
        out = self.attend(q, k, v, self.ring_group, self.ring_rank, ring, drop)
        out = out.reshape(seq_r, b, -1)  # [s/R, b, n/U*d]
        return ulysses.gather_heads(out, self.ulysses_group, u) if u > 1 else out
