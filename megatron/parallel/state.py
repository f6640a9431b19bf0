"""The rank grid: tensor parallel varies fastest, then data, then pipeline.

rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank, so the TP ranks of one group are
consecutive and land on one node (the paper: TP inside a node, PP across nodes). This is also
DeepSpeed's PipeModelDataParallelTopology order (axes pipe, data, model), so our groups and the
pipeline engine's agree. An object passed to layers explicitly; never a module global."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import torch.distributed as dist


def grid_coords(rank: int, tp: int, dp: int, pp: int):
    """(tp_rank, dp_rank, pp_rank) of a global rank."""
    return rank % tp, (rank // tp) % dp, rank // (tp * dp)


def grid_rank(tp_rank: int, dp_rank: int, pp_rank: int, tp: int, dp: int) -> int:
    return pp_rank * (dp * tp) + dp_rank * tp + tp_rank


@dataclass
class ParallelState:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    rank: int = 0
    tp_group: Optional[object] = None
    dp_group: Optional[object] = None
    pp_group: Optional[object] = None
    mp_group: Optional[object] = None  # tensor x pipeline: everything one model replica spans
    pp_ranks: List[int] = field(default_factory=lambda: [0])

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def tp_rank(self) -> int:
        return grid_coords(self.rank, self.tp, self.dp, self.pp)[0]

    @property
    def dp_rank(self) -> int:
        return grid_coords(self.rank, self.tp, self.dp, self.pp)[1]

    @property
    def pp_rank(self) -> int:
        return grid_coords(self.rank, self.tp, self.dp, self.pp)[2]

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    @classmethod
    def single(cls) -> "ParallelState":
        """A world of one, usable without torch.distributed (references and unit tests)."""
        return cls()

    @classmethod
    def build(cls, tp: int, pp: int) -> "ParallelState":
        """Creates every group; all ranks must call it in the same order (collective)."""
        world, rank = dist.get_world_size(), dist.get_rank()
        dp = world // (tp * pp)
        state = cls(tp=tp, pp=pp, dp=dp, rank=rank)
        tp_r, dp_r, pp_r = grid_coords(rank, tp, dp, pp)
        for p in range(pp):
            for d in range(dp):
                ranks = [grid_rank(t, d, p, tp, dp) for t in range(tp)]
                group = dist.new_group(ranks)
                if p == pp_r and d == dp_r:
                    state.tp_group = group
        for p in range(pp):
            for t in range(tp):
                ranks = [grid_rank(t, d, p, tp, dp) for d in range(dp)]
                group = dist.new_group(ranks)
                if p == pp_r and t == tp_r:
                    state.dp_group = group
        for d in range(dp):
            for t in range(tp):
                ranks = [grid_rank(t, d, p, tp, dp) for p in range(pp)]
                group = dist.new_group(ranks)
                if d == dp_r and t == tp_r:
                    state.pp_group, state.pp_ranks = group, ranks
        for d in range(dp):
            ranks = [grid_rank(t, d, p, tp, dp) for p in range(pp) for t in range(tp)]
            group = dist.new_group(ranks)
            if d == dp_r:
                state.mp_group = group
        return state


class DeepSpeedMPU:
    """The mpu interface DeepSpeed expects (model parallel = tensor parallel here)."""

    def __init__(self, state: ParallelState):
        self.state = state

    def get_model_parallel_rank(self):
        return self.state.tp_rank

    def get_model_parallel_world_size(self):
        return self.state.tp

    def get_model_parallel_group(self):
        return self.state.tp_group

    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_group = get_model_parallel_group

    def get_data_parallel_rank(self):
        return self.state.dp_rank

    def get_data_parallel_world_size(self):
        return self.state.dp

    def get_data_parallel_group(self):
        return self.state.dp_group

    def get_pipeline_model_parallel_rank(self):
        return self.state.pp_rank

    def get_pipeline_model_parallel_world_size(self):
        return self.state.pp

    def get_pipeline_model_parallel_group(self):
        return self.state.pp_group
