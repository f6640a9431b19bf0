"""The order of work of one rank in a step of ZB-V (parallel.pipeline_schedule=zbv; Qi et al.
2024, "Pipeline Parallelism with Controllable Memory"): torch-free, read by the executor
(engine/interleaved.py) and replayed by the unit tests.

Placement: 2 p model chunks in a V. Rank r holds local chunk 0 = model chunk r (the way down)
and local chunk 1 = model chunk 2 p - 1 - r (the way up), so rank 0 holds the first chunk and
the last (embedding and head, tied or not, on one rank) and rank p - 1 the two middle ones.

Passes: F, B (the input gradient) and W (the weight gradients) per chunk and micro-batch, each
taking one unit. The order is built by list scheduling on a unit-time replay of every rank: at
each time a free rank runs, of the passes whose inputs are done, a B first (the way up before
the way down: it frees the most), else an F while the rank holds fewer than 2 p chunk
activations (one activation lives from its F to its W: 2 p chunks of half a stage are the p
micro-batches of a stage 1F1B keeps on its first stage), else a W. Each chunk runs its F, B and
W passes in micro-batch order, so every gradient is summed in 1F1B's order. Replayed with
F = B = W the step has no bubble once m >= 2 p (tests/unit/test_engine_v_order.py)."""
from __future__ import annotations

from functools import lru_cache
from typing import Dict, List, Sequence, Tuple

from megatron.config.stages import chunk_owner

F, B, W = "F", "B", "W"
Op = Tuple[str, int, int]  # (F, B or W; local chunk; micro-batch)
CHUNKS = 2


def model_chunk(stages: int, rank: int, local: int) -> int:
    return rank if local == 0 else 2 * stages - 1 - rank


def owner(stages: int, chunk: int) -> Tuple[int, int]:
    """(rank, local chunk) of model chunk `chunk`."""
    return chunk_owner(stages, chunk, v_shape=True)


def _inputs(op: Op, rank: int, stages: int) -> List[Tuple[str, int, int]]:
    """The passes (kind, model chunk, micro-batch) `op` of `rank` waits for."""
    kind, local, mb = op
    c, last = model_chunk(stages, rank, local), 2 * stages - 1
    if kind == F:
        return [] if c == 0 else [(F, c - 1, mb)]
    if kind == B:
        return [(F, c, mb)] + ([] if c == last else [(B, c + 1, mb)])
    return [(B, c, mb)]


@lru_cache(maxsize=64)
def _schedule(stages: int, micro_batches: int) -> Tuple[Tuple[Op, ...], ...]:
    p, m = stages, micro_batches
    nxt = [{(k, l): 0 for k in (F, B, W) for l in range(CHUNKS)} for _ in range(p)]
    done: Dict[Tuple[str, int, int], int] = {}
    held = [0] * p  # chunk activations between F and W
    progs: List[List[Op]] = [[] for _ in range(p)]
    t, total = 0, 3 * CHUNKS * m
    while any(len(prog) < total for prog in progs):
        finished = []
        for r in range(p):
            op = _pick(r, p, m, t, nxt[r], done, held[r])
            if op is None:
                continue
            kind, local, mb = op
            nxt[r][(kind, local)] += 1
            held[r] += {F: 1, B: 0, W: -1}[kind]
            progs[r].append(op)
            finished.append(((kind, model_chunk(p, r, local), mb), t + 1))
        done.update(finished)  # visible from t + 1 on: a pass takes one unit
        t += 1
        if t > 10 * total * p:
            raise RuntimeError(f"ZB-V order for p={p}, m={m} does not finish")
    return tuple(tuple(prog) for prog in progs)


def _pick(r: int, p: int, m: int, t: int, nxt, done, held: int):
    def ready(kind, local):
        mb = nxt[(kind, local)]
        if mb >= m:
            return None
        op = (kind, local, mb)
        ok = all(done.get(dep, t + 1) <= t for dep in _inputs(op, r, p))
        return op if ok else None

    for kind, local in ((B, 1), (B, 0)):
        op = ready(kind, local)
        if op:
            return op
    if held < 2 * p:
        for local in (1, 0):
            op = ready(F, local)
            if op:
                return op
    for local in (1, 0):
        op = ready(W, local)
        if op:
            return op
    return None


def check(stages: int, chunks: int, micro_batches: int) -> None:
    if chunks != CHUNKS:
        raise ValueError(f"ZB-V holds {CHUNKS} chunks per rank, not {chunks}")
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"stages {stages}, micro-batches {micro_batches}: each at least 1")


def rank_ops(stages: int, rank: int, chunks: int, micro_batches: int) -> List[Op]:
    """Every F, B and W pass of `rank` in a step, in the order it runs them."""
    check(stages, chunks, micro_batches)
    return list(_schedule(stages, micro_batches)[rank])


def replay(stages: int, micro_batches: int,
           seconds: Sequence[Dict[str, float]] = ()) -> float:
    """Runs every rank's order at once, each pass waiting for its inputs (sends never block),
    with seconds[rank][F, B or W] per chunk pass (1 each by default); returns the makespan.
    Raises on a deadlock."""
    p = stages
    progs = [rank_ops(p, r, CHUNKS, micro_batches) for r in range(p)]
    cost = list(seconds) or [{F: 1.0, B: 1.0, W: 1.0}] * p
    pc, clock, done = [0] * p, [0.0] * p, {}
    while any(pc[r] < len(progs[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while pc[r] < len(progs[r]):
                op = progs[r][pc[r]]
                deps = _inputs(op, r, p)
                if any(d not in done for d in deps):
                    break
                kind, local, mb = op
                clock[r] = max([clock[r]] + [done[d] for d in deps]) + cost[r][kind]
                done[(kind, model_chunk(p, r, local), mb)] = clock[r]
                pc[r] += 1
                moved = True
        if not moved:
            raise RuntimeError("ZB-V order deadlocks at "
                               f"{[progs[r][pc[r]] if pc[r] < len(progs[r]) else None for r in range(p)]}")
    return max(clock)
