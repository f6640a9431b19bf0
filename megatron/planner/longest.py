"""The longest sequence a model trains at on a number of nodes, and the layout that does it.

A sequence fits when some layout of the search space fits the device memory at it
(search.evaluate, memory only). Memory grows with the sequence in every layout, so the answer
is found by doubling from 1024 tokens until nothing fits, then bisecting between the last
length that fits and the first that does not in steps of `step` tokens (1024 by default: every
length tried is a multiple of it, so it splits over context-parallel degrees that are powers
of two up to 1024). The space is the least-memory corner unless the caller gives another:
micro-batch 1, full recompute, FlashAttention, ZeRO 1-3, SP on and off, 1F1B (zbh1 keeps more
in flight), every context-parallel degree (SearchSpace.cp None)."""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import List, Optional

from megatron.config.errors import InputError
from megatron.config.schedules.one_f_one_b import ONE_F_ONE_B
from megatron.planner.layout import Job, layout_problem
from megatron.planner.profile import Profile
from megatron.planner.search import (Candidate, SearchSpace, enumerate_layouts, evaluate,
                                     rank_key, unrunnable_message)

LEAST_MEMORY = SearchSpace(micro_batch=(1,), zero=(1, 2, 3), recompute=("full",), flash=(True,),
                           schedules=(ONE_F_ONE_B.name,), cp=None,
                           cp_algos=("ulysses", "ring", "allgather", "hybrid"))
MAX_SEQ = 1 << 22


def with_sequence(job: Job, seq: int) -> Job:
    """The job at sequence length `seq` (learned positions grow with it)."""
    m = job.model
    model = dataclasses.replace(m, seq_length=seq,
                                max_position_embeddings=max(seq, m.max_position_embeddings))
    return dataclasses.replace(job, model=model)


def fitting(job: Job, nodes: int, prof: Profile, space: SearchSpace,
            first_only: bool = False) -> List[Candidate]:
    """The layouts of the space that fit (the first one found, with first_only), memory only.
    A space that holds no layout the engine runs is refused (search.unrunnable_message), not
    reported as fitting nothing."""
    world = nodes * prof.spec.gpus_per_node
    out, enumerated, unrunnable = [], 0, Counter()
    for lay in enumerate_layouts(job, world, prof.spec.gpus_per_node, space,
                                 prof.spec.framework, unrunnable):
        enumerated += 1
        if layout_problem(job, lay, prof.spec.framework):
            continue
        cand = evaluate(job, lay, prof, space, with_time=False)
        if cand.fits:
            out.append(cand)
            if first_only:
                break
    if not enumerated and unrunnable:
        raise InputError(unrunnable_message(world, prof.spec.framework, unrunnable))
    return out


@dataclass(frozen=True)
class LongestResult:
    seq: int                    # the longest length that fits (0: not even `step` tokens)
    job: Job                    # the job at that length
    ranked: List[Candidate]     # the layouts that fit at it, fastest first
    first_fail: Optional[int]   # the shortest length tried that nothing fits


def longest_sequence(job: Job, nodes: int, prof: Profile,
                     space: SearchSpace = LEAST_MEMORY, step: int = 1024) -> LongestResult:
    def fits(seq: int) -> bool:
        return bool(fitting(with_sequence(job, seq), nodes, prof, space, first_only=True))

    good, bad = 0, None
    seq = step
    while seq <= MAX_SEQ:
        if not fits(seq):
            bad = seq
            break
        good, seq = seq, seq * 2
    if bad is not None:
        while bad - good > step:
            mid = (good + bad) // 2 // step * step
            if mid <= good:
                break
            good, bad = (mid, bad) if fits(mid) else (good, mid)
    if not good:
        return LongestResult(0, job, [], bad)
    best_job = with_sequence(job, good)
    ranked = [evaluate(best_job, c.layout, prof, space)
              for c in fitting(best_job, nodes, prof, space)]
    ranked.sort(key=rank_key)
    return LongestResult(good, best_job, ranked, bad)
