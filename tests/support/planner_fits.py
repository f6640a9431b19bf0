"""The planner's fits over published.yaml, made once per test process: leave_one_out refits the
time model for every case and every source (about 6 s), and three tests read its rows."""
from __future__ import annotations

import functools
from typing import Tuple


@functools.lru_cache(maxsize=None)
def published_rows() -> Tuple:
    """validation.leave_one_out over published.yaml's cases, as a tuple (shared: not to be
    changed)."""
    from megatron.planner import validation
    return tuple(validation.leave_one_out(validation.load_cases()))
