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

Backward: the forward is written in autograd-able pieces (the ring shift's backward sends the
gradient back along the ring; the all-gather's backward reduce-scatters), so the backward is
correct by construction; the cost is memory: autograd keeps every step's key/value block and
scores (an explicit backward ring that recomputes them would keep only q, k, v, out and lse)."""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from megatron.config import ModelConfig, variants
from megatron.model.block_attention import block_attention, merge
from megatron.model.context import ModelContext
from megatron.parallel import cp_layout, ulysses
from megatron.parallel.mappings import gather_from_sequence_parallel_region
from megatron.parallel.ring import ring_shift

log = logging.getLogger(__name__)


def chunks_of(ring_rank: int, ring: int):
    """The two chunk indices (of 2R) ring rank r holds: an early and a late one."""
    return ring_rank, 2 * ring - 1 - ring_rank


def ring_attention(q, k, v, group, ring_rank: int, ring: int, drop=None) -> torch.Tensor:
    """q [S, b, n, d], k and v [S, b, g, d] of this ring rank's two chunks -> [S, b, n, d]."""
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
        if ctx.backend != "math":
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
