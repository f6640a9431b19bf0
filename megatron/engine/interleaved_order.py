"""The order of work of one rank in a step of interleaved 1F1B (parallel.pipeline_schedule=
interleaved): plain (op, local chunk, micro-batch) triples, torch-free, so the executor
(engine/interleaved.py) and the unit tests (which replay every rank at once, `replay`) read the
same order.

Rank r of p holds v local chunks; local chunk c is model chunk c p + r of p v. The order is
Megatron-LM's forward_backward_pipelining_with_interleaving (schedules.py): a rank's m v chunk
passes are numbered k = 0 .. m v - 1; pass k runs micro-batch (k // (p v)) p + k % p on local
chunk (k % (p v)) // p, forwards in that order and backwards with the chunks reversed. A rank
first runs 2 (p - r - 1) + (v - 1) p forwards (all of them when m = p), then alternates one
forward and one backward, then drains the backwards. With v = 1 it is 1F1B with a warm-up of
p - r - 1 forwards."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from megatron.config.stages import chunk_owner

F, B = "F", "B"
Op = Tuple[str, int, int]  # (F or B, local chunk, micro-batch)


def _pass(k: int, stages: int, chunks: int, forward: bool) -> Tuple[int, int]:
    """(local chunk, micro-batch) of this rank's k-th forward (or backward) pass."""
    group = stages * chunks
    chunk = (k % group) // stages
    if not forward:
        chunk = chunks - 1 - chunk
    return chunk, (k // group) * stages + k % stages


def warmup(stages: int, rank: int, chunks: int, micro_batches: int) -> int:
    """Forwards rank `rank` runs before its first backward."""
    total = micro_batches * chunks
    if chunks == 1:
        return min(stages - rank - 1, total)
    if micro_batches == stages:
        return total
    return min(2 * (stages - rank - 1) + (chunks - 1) * stages, total)


def check(stages: int, chunks: int, micro_batches: int) -> None:
    if stages < 1 or chunks < 1 or micro_batches < 1:
        raise ValueError(f"stages {stages}, chunks {chunks}, micro-batches {micro_batches}: "
                         "each at least 1")
    if chunks > 1 and micro_batches % stages:
        raise ValueError(f"interleaving needs micro-batches ({micro_batches}) in multiples of "
                         f"the stages ({stages})")


def rank_ops(stages: int, rank: int, chunks: int, micro_batches: int) -> List[Op]:
    """Every forward and backward pass of `rank` in a step, in the order it runs them."""
    check(stages, chunks, micro_batches)
    total = micro_batches * chunks
    first = warmup(stages, rank, chunks, micro_batches)
    fwd = [(F, *_pass(k, stages, chunks, True)) for k in range(total)]
    bwd = [(B, *_pass(k, stages, chunks, False)) for k in range(total)]
    ops = fwd[:first]
    for k in range(total - first):
        ops += [fwd[first + k], bwd[k]]
    return ops + bwd[total - first:]


def model_chunk(stages: int, rank: int, local: int) -> int:
    return local * stages + rank


def owner(stages: int, chunk: int) -> Tuple[int, int]:
    """(rank, local chunk) of model chunk `chunk`."""
    return chunk_owner(stages, chunk)


def _ready(op: Op, rank: int, stages: int, chunks: int, done: set) -> bool:
    """Whether `op` of `rank` has its input: the previous chunk's forward (F), or the next
    chunk's backward and its own forward (B)."""
    kind, local, mb = op
    c, last = model_chunk(stages, rank, local), stages * chunks - 1
    if kind == F:
        return c == 0 or (F, c - 1, mb) in done
    return (F, c, mb) in done and (c == last or (B, c + 1, mb) in done)


def replay(stages: int, chunks: int, micro_batches: int,
           seconds: Sequence[Dict[str, float]] = ()) -> float:
    """Runs every rank's order at once, each op waiting for its input (sends never block, as
    the executor's isend), and returns the makespan with seconds[rank][F or B] per chunk pass
    (1 each by default). Raises on a deadlock."""
    progs = [rank_ops(stages, r, chunks, micro_batches) for r in range(stages)]
    cost = list(seconds) or [{F: 1.0, B: 1.0}] * stages
    pc, clock, done = [0] * stages, [0.0] * stages, {}
    while any(pc[r] < len(progs[r]) for r in range(stages)):
        moved = False
        for r in range(stages):
            while pc[r] < len(progs[r]) and _ready(progs[r][pc[r]], r, stages, chunks, done):
                kind, local, mb = progs[r][pc[r]]
                c = model_chunk(stages, r, local)
                need = [done.get((F, c - 1, mb), 0.0)] if kind == F else \
                    [done[(F, c, mb)], done.get((B, c + 1, mb), 0.0)]
                clock[r] = max([clock[r]] + need) + cost[r][kind]
                done[(kind, c, mb)] = clock[r]
                pc[r] += 1
                moved = True
        if not moved:
            raise RuntimeError(f"interleaved order deadlocks at "
                               f"{[progs[r][pc[r]] if pc[r] < len(progs[r]) else None for r in range(stages)]}")
    return max(clock)
