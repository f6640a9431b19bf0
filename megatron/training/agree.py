"""What every rank decides together after each step, in one small all-reduce: whether a stop
was signalled (any rank), whether a save is due and the deadline reached (rank 0's clocks, so
all ranks save alike), the divergence guard's action (the most severe of any rank), and where
the background checkpoint writers are (the furthest from done of any rank: an asynchronous save
commits once every rank's writer is done, and ends the run once any failed)."""
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
    writer: int = 0  # WRITER_*: this rank's background checkpoint writer


# A rank's background checkpoint writer, ordered so that the maximum over ranks is what every
# rank must do: commit once all are done, wait while any writes, fail once any failed.
WRITER_IDLE, WRITER_DONE, WRITER_BUSY, WRITER_FAILED = 0, 1, 2, 3


def agree(mine: Decisions, device: torch.device) -> Decisions:
    """Collective; the clocks count on rank 0 only, the rest is the maximum over ranks."""
    rank0 = dist.get_rank() == 0
    local = (mine.signalled, rank0 and mine.save_due, rank0 and mine.out_of_time, mine.action,
             mine.writer)
    if dist.get_world_size() == 1:  # nobody to agree with: the same answer without a collective
        return Decisions(bool(local[0]), bool(local[1]), bool(local[2]), int(local[3]),
                         int(local[4]))
    flags = torch.tensor([float(x) for x in local], device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    got = flags.tolist()  # one device-to-host copy, not one per flag
    return Decisions(bool(got[0]), bool(got[1]), bool(got[2]), int(got[3]), int(got[4]))
