"""What every rank decides together after each step, in one small all-reduce: whether a stop
was signalled (any rank), whether a save is due and the deadline reached (rank 0's clocks, so
all ranks save alike), and the divergence guard's action (the most severe of any rank)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Decisions:
    signalled: bool
    save_due: bool
    out_of_time: bool
    action: int  # training.health: OK, ROLLBACK or STOP


def agree(mine: Decisions, device: torch.device) -> Decisions:
    """Collective; the clocks count on rank 0 only, the rest is the maximum over ranks."""
    rank0 = dist.get_rank() == 0
    local = (mine.signalled, rank0 and mine.save_due, rank0 and mine.out_of_time, mine.action)
    if dist.get_world_size() == 1:  # nobody to agree with: the same answer without a collective
        return Decisions(bool(local[0]), bool(local[1]), bool(local[2]), int(local[3]))
    flags = torch.tensor([float(x) for x in local], device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return Decisions(bool(flags[0].item()), bool(flags[1].item()), bool(flags[2].item()),
                     int(flags[3].item()))
