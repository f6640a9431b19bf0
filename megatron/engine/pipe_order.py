"""The order of work of one pipeline stage in a training step, for the schedules of
`parallel.pipeline_schedule` that run on DeepSpeed's lock steps (their records' lock_steps), as
plain (op, micro-batch) pairs: torch- and DeepSpeed-free, so the engine (zero_bubble.py turns it
into DeepSpeed instructions) and the planner's tests (which replay it with measured pass times,
`makespan`) read the same schedule. A record that splits the backward (split_backward) gets W
passes; the others run each backward whole.

1f1b is DeepSpeed's TrainSchedule: 2 (m + p - 1) lock steps; in each a stage either runs a
forward or a backward pass or sits in the bubble. Its sends and receives are blocking and paired
by step parity, which is why it never deadlocks; zbh1 keeps every one of them where it is.

zbh1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", schedule ZB-H1) splits the backward
into B (the gradient of the stage input, which the previous stage waits for) and W (the weight
gradients, which only the optimizer step needs). B sends its gradient upstream without waiting
for W, so the gradient wave that drains the pipeline travels at the speed of B, and the W passes
run in the slots where the stage would have idled: with F = B = W the bubble falls from
(p - 1)(F + B + W) to (p - 1)(F + B - W), a third. Memory: a W keeps its micro-batch's
linear-layer inputs and output gradients, so before a forward pass a stage that already holds
p micro-batches (1F1B's peak, that of its first stage) runs its oldest pending W first."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from megatron.config import schedules

# op names: forward, input-gradient backward (the whole backward under 1f1b), weight gradient,
# load a micro-batch, and the four blocking transfers
F, B, W, LOAD = "F", "B", "W", "LOAD"
SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD = "SEND_ACT", "RECV_ACT", "SEND_GRAD", "RECV_GRAD"
Op = Tuple[str, int]


def _slot(step: int, stage: int, stages: int) -> Tuple[int, bool]:
    """(micro-batch, is_forward) of `stage` at lock step `step`, as DeepSpeed's TrainSchedule
    maps them (a micro-batch outside [0, m) is a bubble slot)."""
    if step % 2 == stage % 2:
        return (step if step % 2 == 0 else step - 1) // 2 - stage // 2, True
    if step % 2 == 0:
        return step // 2 - stages + (stage + 1) // 2, False
    return (step - 1) // 2 - stages + 1 + stage // 2, False


def _split_backward(schedule: str) -> bool:
    """Whether `schedule` runs W passes; raises for a schedule whose order is not DeepSpeed's
    lock steps (its record's lock_steps), which this module cannot write."""
    record = schedules.get(schedule)
    if not record.lock_steps:
        lock_step = [n for n in schedules.names() if schedules.get(n).lock_steps]
        raise ValueError(f"pipeline schedule {schedule!r} does not run on DeepSpeed's lock "
                         f"steps: expected one of {lock_step}")
    return record.split_backward


def stage_steps(schedule: str, stages: int, stage: int, micro_batches: int) -> List[List[Op]]:
    """The lock steps of `stage`, each a list of (op, micro-batch). Under zbh1 every B is followed,
    later, by the W of the same micro-batch, in micro-batch order, all before the last step ends
    (where the engine appends the gradient reductions and the optimizer step)."""
    split = _split_backward(schedule)
    p, s, m = stages, stage, micro_batches
    total = 2 * (m + p - 1)
    pending: List[int] = []  # micro-batches whose B ran and whose W did not
    held = 0  # micro-batches whose forward ran and whose W did not (their activations)
    prev, steps = -1, []
    for step in range(total):
        mb, forward = _slot(step, s, p)
        valid, prev_valid = 0 <= mb < m, 0 <= prev < m
        ops: List[Op] = []
        if split and forward and valid:
            while held >= p and pending:
                ops.append((W, pending.pop(0)))
                held -= 1
        if forward:
            if prev_valid and s > 0:
                ops.append((SEND_GRAD, prev))
            if valid and s > 0:
                ops.append((RECV_ACT, mb))
        else:
            if valid and s < p - 1:
                ops.append((RECV_GRAD, mb))
            if prev_valid and s < p - 1:
                ops.append((SEND_ACT, prev))
        if valid and forward and s in (0, p - 1):
            ops.append((LOAD, mb))
        if valid:
            ops.append((F if forward else B, mb))
            if forward:
                held += 1
            elif split:
                pending.append(mb)
        elif pending:  # a bubble slot: fill it with the oldest W
            ops.append((W, pending.pop(0)))
            held -= 1
        if step == total - 1:
            ops += [(W, k) for k in pending]
            pending = []
        prev = mb
        steps.append(ops)
    return steps


def stage_ops(schedule: str, stages: int, stage: int, micro_batches: int) -> List[Op]:
    return [op for step in stage_steps(schedule, stages, stage, micro_batches) for op in step]


_PEER = {SEND_ACT: (1, RECV_ACT), RECV_ACT: (-1, SEND_ACT),
         SEND_GRAD: (-1, RECV_GRAD), RECV_GRAD: (1, SEND_GRAD)}


def makespan(schedule: str, stages: int, micro_batches: int,
             seconds: Sequence[Dict[str, float]]) -> float:
    """Seconds from the first pass to the last of a step whose stage i spends seconds[i][op] in
    each F, B and W (under 1f1b, B is the whole backward and W is not run) and whose transfers
    take no time but block until both ends reach them (a send waits for its receive, as gloo's
    and NCCL's blocking point-to-point operations do). Raises on a deadlock."""
    progs = [stage_ops(schedule, stages, i, micro_batches) for i in range(stages)]
    pc, clock = [0] * stages, [0.0] * stages
    while True:
        moved = False
        for i in range(stages):
            while pc[i] < len(progs[i]):
                op, mb = progs[i][pc[i]]
                if op in (F, B, W, LOAD):
                    clock[i] += seconds[i].get(op, 0.0)
                    pc[i] += 1
                    moved = True
                    continue
                offset, partner = _PEER[op]
                j = i + offset
                if pc[j] < len(progs[j]) and progs[j][pc[j]] == (partner, mb):
                    clock[i] = clock[j] = max(clock[i], clock[j])
                    pc[i] += 1
                    pc[j] += 1
                    moved = True
                    continue
                break
        if all(pc[i] == len(progs[i]) for i in range(stages)):
            return max(clock)
        if not moved:
            raise RuntimeError(f"{schedule}: the stages deadlock at "
                               f"{[progs[i][pc[i]] if pc[i] < len(progs[i]) else None for i in range(stages)]}")


def peak_held(schedule: str, stages: int, stage: int, micro_batches: int) -> int:
    """The most micro-batches whose activations `stage` holds at once: forward run and backward
    (1f1b) or W (zbh1) not yet."""
    held = peak = 0
    done = W if _split_backward(schedule) else B
    for op, _ in stage_ops(schedule, stages, stage, micro_batches):
        held += (op == F) - (op == done)
        peak = max(peak, held)
    return peak
