"""Which tokens a context-parallel rank holds, and the groups its algorithm talks over: the one
home of the sequence layout, read by the embedding (tokens and learned positions), rotary
positions, the loss (labels) and the attention wrappers.

Ulysses (parallel/ulysses.py): rank c of C holds the contiguous slice [c*s/C, (c+1)*s/C).

Ring, all-gather and hybrid (parallel/ring.py, model/context_attention.py): under a causal
mask a contiguous split gives the last rank all the work (its queries see every key) and the
first almost none. The ring part of degree R cuts the sequence into 2R equal chunks and gives
ring rank r chunks r and 2R-1-r, an early and a late one, so every rank attends to the same
number of (query, key) pairs. Hybrid (Ulysses degree U inside, ring R across, C = U x R):
cp_rank = ring_rank * U + ulysses_rank, the Ulysses ranks of one ring rank consecutive (they
exchange the most bytes); ring rank r's tokens (its two chunks, in that order) are split
contiguously over its U ranks, so Ulysses' all-to-all gathers exactly them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from megatron.config import context_parallel
from megatron.parallel.grid import Grid
from megatron.parallel.ulysses import local_sequence


@dataclass(frozen=True)
class CPLayout:
    algo: str = context_parallel.DEFAULT
    cp: int = 1
    ulysses: int = 1  # U: ranks that exchange heads
    ring: int = 1  # R: ranks over which the sequence is load-balanced

    @classmethod
    def of(cls, algo: str, cp: int, ulysses_degree: int = 0) -> "CPLayout":
        u, r = context_parallel.degrees(algo, cp, ulysses_degree)
        return cls(algo, cp, u, r)

    @property
    def balanced(self) -> bool:
        """Whether tokens are held load-balanced (any ring part) instead of contiguously."""
        return self.ring > 1


def ring_positions(seq: int, ring_rank: int, ring: int, device=None) -> torch.Tensor:
    """Global positions [seq/R] of ring rank r's tokens: chunk r, then chunk 2R-1-r of 2R."""
    n = seq // (2 * ring)
    first = torch.arange(ring_rank * n, (ring_rank + 1) * n, device=device)
    late = 2 * ring - 1 - ring_rank
    return torch.cat([first, torch.arange(late * n, (late + 1) * n, device=device)])


def token_index(seq: int, cp_rank: int, layout: CPLayout, device=None) -> torch.Tensor:
    """Global positions [seq/C] of the tokens context-parallel rank cp_rank holds."""
    n = seq // layout.cp
    if not layout.balanced:
        return torch.arange(cp_rank * n, (cp_rank + 1) * n, device=device)
    ring_rank, ulysses_rank = divmod(cp_rank, layout.ulysses)
    return ring_positions(seq, ring_rank, layout.ring, device)[ulysses_rank * n:
                                                               (ulysses_rank + 1) * n]


def local_tokens(x: torch.Tensor, state, dim: int) -> torch.Tensor:
    """This rank's tokens of a whole-sequence tensor x along `dim` (tokens, labels)."""
    layout = state.cp_layout
    if not layout.balanced:  # Ulysses or no CP: the contiguous slice, as before
        return local_sequence(x, state.cp_rank, state.cp, dim)
    index = token_index(x.shape[dim], state.cp_rank, layout, x.device)
    return x.index_select(dim, index)


def split_grid(dense: Grid, layout: CPLayout) -> Grid:
    """The dense grid with its cp axis split into ring (outer) x ulysses (inner) axes, and the
    two groups over them: a second grid over the same ranks (ParallelState.add_grid)."""
    axes = []
    for name, size in dense.axes:
        axes += [("cpr", layout.ring), ("cpu", layout.ulysses)] if name == "cp" else [(name, size)]
    return Grid(tuple(axes), (("cp_ring", ("cpr",)), ("cp_ulysses", ("cpu",))))


def ring_group(state) -> Optional[object]:
    """The process group key/value blocks travel around (the whole cp group but for hybrid)."""
    return state.group("cp_ring") if state.cp_layout.ulysses > 1 else state.cp_group


def ulysses_group(state) -> Optional[object]:
    """The process group that exchanges heads (the whole cp group for Ulysses)."""
    layout = state.cp_layout
    return state.group("cp_ulysses") if layout.balanced else state.cp_group


def ring_rank(state) -> int:
    return state.cp_rank // state.cp_layout.ulysses


def cp_layout_of(parallel) -> CPLayout:
    """The layout the parallel config section asks for."""
    return CPLayout.of(parallel.context_parallel_algo, parallel.context_parallel_size,
                       parallel.ulysses_degree)
