"""The context-parallel algorithms (parallel.context_parallel_algo) and how each splits the
degree C = parallel.context_parallel_size: the one home of those facts, read by the
validation, the model (parallel/cp_layout.py) and the planner. Torch-free.

- ulysses: DeepSpeed-Ulysses' head exchange over all C ranks (capped by the query heads);
- ring: key/value blocks travel around the C ranks; no head cap;
- allgather: each rank all-gathers the key/value heads of the whole sequence once (Llama 3's
  choice with grouped-query attention: few key/value heads are cheap to gather);
- hybrid: Ulysses inside groups of parallel.ulysses_degree ranks x ring across C / that."""
from __future__ import annotations

import typing
from typing import Literal, Tuple

Algo = Literal["ulysses", "ring", "allgather", "hybrid"]
ALGOS = typing.get_args(Algo)
DEFAULT = "ulysses"
# Algorithms whose ring part holds the sequence load-balanced (rank r: chunks r and 2R-1-r).
LOAD_BALANCED = ("ring", "allgather", "hybrid")


def degrees(algo: str, cp: int, ulysses_degree: int = 0) -> Tuple[int, int]:
    """(U, R): the Ulysses degree (ranks that exchange heads) and the ring degree (ranks over
    which the sequence is load-balanced and key/values travel); U x R = cp."""
    if algo == "ulysses":
        return cp, 1
    if algo == "hybrid":
        return ulysses_degree, cp // max(ulysses_degree, 1)
    return 1, cp
