"""Context parallelism by head exchange (DeepSpeed-Ulysses; Megatron's cp_comm_type=a2a).

Each of the C ranks of a context-parallel group holds [s/C, b, h]: its slice of the same
samples. Everything but attention is token-local, so it runs on the slice unchanged. Attention
needs the whole sequence: one all-to-all on q, k and v together deals each rank 1/C of the
heads over the whole sequence ([s, b, heads/C, d]); any backend runs on that; a second
all-to-all gives every rank back its positions with all heads ([s/C, b, heads*d]).

Key/value heads: a rank's g key/value groups serve its n query heads in blocks of n/g. When g
does not split over C (fewer key/value heads than ranks, say), each group is repeated r times
before the exchange so that C divides g*r and every rank's query block is served by the
key/value heads it receives (see kv_replicas)."""
from __future__ import annotations

import math
from typing import Tuple

import torch

from megatron.parallel.mappings import (all_to_all_heads_to_sequence,
                                        all_to_all_sequence_to_heads)


def kv_replicas(kv_heads: int, q_per_group: int, cp: int) -> int:
    """How many copies of each key/value head go into the exchange: 1 when they split over cp;
    else the fewest copies r with cp | kv_heads*r whose q_per_group/r query heads each copy
    serves are whole; q_per_group (one copy per query head, as multi-head attention) when no
    smaller r does. Needs cp | kv_heads*q_per_group (config/validate.py)."""
    if kv_heads % cp == 0:
        return 1
    r = cp // math.gcd(kv_heads, cp)
    return r if q_per_group % r == 0 else q_per_group


def local_sequence(x: torch.Tensor, rank: int, size: int, dim: int) -> torch.Tensor:
    """This context-parallel rank's contiguous slice of the sequence dimension `dim`."""
    if size == 1:
        return x
    n = x.shape[dim] // size
    return x.narrow(dim, rank * n, n)


def scatter_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group, cp: int,
                  replicas: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [s/C, b, n, d], k and v [s/C, b, g, d] -> q [s, b, n/C, d], k, v [s, b, g*r/C, d]:
    one all-to-all for the three."""
    if replicas > 1:
        k = k.repeat_interleave(replicas, dim=2)
        v = v.repeat_interleave(replicas, dim=2)
    s, b, n, d = q.shape
    g = k.shape[2]
    both = torch.cat([q.reshape(s, b, cp, n // cp, d), k.reshape(s, b, cp, g // cp, d),
                      v.reshape(s, b, cp, g // cp, d)], dim=3)  # [s/C, b, C, (n+2g)/C, d]
    full = all_to_all_sequence_to_heads(both, group)  # [s, b, (n+2g)/C, d]
    return full.split([n // cp, g // cp, g // cp], dim=2)


def gather_heads(out: torch.Tensor, group, cp: int) -> torch.Tensor:
    """Attention output [s, b, n/C*d] -> [s/C, b, n*d], heads in the order before scatter_heads."""
    s, b, width = out.shape
    parts = all_to_all_heads_to_sequence(out.view(s, b, 1, width), group)  # [s/C, b, C, 1, w]
    return parts.reshape(s // cp, b, cp * width)
