"""The order of work of one rank in a step of interleaved 1F1B (parallel.pipeline_schedule=
interleaved): plain (op, local chunk, micro-batch) triples, torch-free, so the executor
(engine/interleaved.py) and the unit tests (which replay every rank at once, `replay`) read the
same order.

Rank r of p holds v local chunks; local chunk c is model chunk c p + r of p v. The order is
Megatron's forward_backward_pipelining_with_interleaving (schedules.py): the micro-batches come
in groups of N (parallel.pipeline_microbatch_group, by default p; the last group holds what is
left, 0 or at least p of them: config/interleaving.group_fits), and each group passes local
chunk 0, then chunk 1, ..., micro-batch by micro-batch; that is the forward order, the backward
order the same with the chunks reversed. A rank first runs 2 (p - r - 1) + (v - 1) N forwards
(all of them when m = p), then alternates one forward and one backward, then drains the
backwards. With v = 1 it is 1F1B with a warm-up of p - r - 1 forwards. Within a chunk the
micro-batches pass in increasing order whatever N is, so each chunk accumulates its gradients
in 1F1B's order."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from megatron.config.interleaving import group_fits
from megatron.config.stages import chunk_owner

F, B = "F", "B"
Op = Tuple[str, int, int]  # (F or B, local chunk, micro-batch)


def passes(chunks: int, micro_batches: int, group: int) -> List[Tuple[int, int]]:
    """(local chunk, micro-batch) of a rank's forward passes in order: groups of `group`
    micro-batches (the last one what is left), each through chunk 0, 1, ..., v - 1."""
    out: List[Tuple[int, int]] = []
    for start in range(0, micro_batches, group):
        members = range(start, min(start + group, micro_batches))
        out += [(chunk, mb) for chunk in range(chunks) for mb in members]
    return out


def warmup(stages: int, rank: int, chunks: int, micro_batches: int, group: int = 0) -> int:
    """Forwards rank `rank` runs before its first backward."""
    total = micro_batches * chunks
    if chunks == 1:
        return min(stages - rank - 1, total)
    if micro_batches == stages:
        return total
    return min(2 * (stages - rank - 1) + (chunks - 1) * (group or stages), total)


def check(stages: int, chunks: int, micro_batches: int, group: int = 0) -> None:
    if stages < 1 or chunks < 1 or micro_batches < 1:
        raise ValueError(f"stages {stages}, chunks {chunks}, micro-batches {micro_batches}: "
                         "each at least 1")
    if chunks > 1 and not group_fits(stages, micro_batches, group or stages):
        raise ValueError(f"interleaving runs micro-batches ({micro_batches}) in groups "
                         f"({group or stages}) of at least the stages ({stages}), the last "
                         "group too (config/interleaving.group_fits)")


def rank_ops(stages: int, rank: int, chunks: int, micro_batches: int,
             group: int = 0) -> List[Op]:
    """Every forward and backward pass of `rank` in a step, in the order it runs them; group:
    the micro-batches a chunk takes in a row (0: the stages)."""
    check(stages, chunks, micro_batches, group)
    total = micro_batches * chunks
    first = warmup(stages, rank, chunks, micro_batches, group)
    order = passes(chunks, micro_batches, group or stages)
    fwd = [(F, chunk, mb) for chunk, mb in order]
    bwd = [(B, chunks - 1 - chunk, mb) for chunk, mb in order]
    ops = fwd[:first]
    for k in range(total - first):
        ops += [fwd[first + k], bwd[k]]
    return ops + bwd[total - first:]


@dataclass(frozen=True)
class Grouped:
    """This order with its micro-batches in groups of `group` (parallel.pipeline_microbatch_
    group): what engine/chunks.py hands the executor in place of the module when it is set."""
    group: int
    F = F
    B = B

    def rank_ops(self, stages: int, rank: int, chunks: int, micro_batches: int) -> List[Op]:
        return rank_ops(stages, rank, chunks, micro_batches, self.group)

    def replay(self, stages: int, chunks: int, micro_batches: int,
               seconds: Sequence[Dict[str, float]] = ()) -> float:
        return replay(stages, chunks, micro_batches, seconds, self.group)

    @staticmethod
    def model_chunk(stages: int, rank: int, local: int) -> int:
        return model_chunk(stages, rank, local)

    @staticmethod
    def owner(stages: int, chunk: int) -> Tuple[int, int]:
        return owner(stages, chunk)


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
           seconds: Sequence[Dict[str, float]] = (), group: int = 0) -> float:
    """Runs every rank's order at once, each op waiting for its input (sends never block, as
    the executor's isend), and returns the makespan with seconds[rank][F or B] per chunk pass
    (1 each by default). Raises on a deadlock."""
    progs = [rank_ops(stages, r, chunks, micro_batches, group) for r in range(stages)]
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
