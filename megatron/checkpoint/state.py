"""What a rank hands to the checkpoint code: its parameters and the pieces of the optimizer
state it owns, described without reference to the layout, so another layout can read them.

The engine (engine/state.py) builds these from DeepSpeed's optimizers; everything in
megatron/checkpoint works on them only."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

from megatron.parallel.state import RankCoord

# The optimizer state carried per element, beside the fp32 master weight (AdamW).
MOMENTS = ("exp_avg", "exp_avg_sq")
KEYS = ("master",) + MOMENTS


def resize_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """Padded vocabulary rows cut or zero-padded to another padding. Rows past the tokenizer's
    vocabulary are never a target, so only real ids' rows carry learned values."""
    if t.shape[0] >= rows:
        return t[:rows]
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])


@dataclass
class Partition:
    """How a parameter is split over tensor-parallel ranks (set where the layer creates it)."""
    dim: Optional[int] = None  # None: replicated on every TP rank
    stride: int = 1            # blocks along dim that are split separately (fused [gate; up])
    vocab: bool = False        # rows are the padded vocabulary (padding depends on TP)

    @classmethod
    def of(cls, param: torch.Tensor) -> "Partition":
        dim = getattr(param, "partition_dim", None)
        return cls(dim, getattr(param, "partition_stride", 1), getattr(param, "vocab_rows", False))


@dataclass
class ExpertSplit:
    """Which experts a stacked expert parameter holds (model/moe/experts.mark_experts): experts
    [first, first + local) of num_experts along dim 0. A checkpoint stores the tensor under its
    global shape [num_experts, ...] (checkpoint/experts.py), so any expert-parallel size reads it."""
    num_experts: int
    first: int
    local: int
    writer: bool = True  # the first rank holding these experts (mark_experts)

    @classmethod
    def of(cls, param: torch.Tensor, shape: Tuple[int, ...]) -> Optional["ExpertSplit"]:
        if getattr(param, "expert_dim", None) is None:
            return None
        return cls(param.num_experts, param.first_expert, shape[0],
                   getattr(param, "expert_writer", True))

    @property
    def ep(self) -> int:
        """The expert-parallel size that wrote it: E / experts held."""
        return self.num_experts // self.local


@dataclass
class Fragment:
    """Elements [start, start + numel) of a parameter's flattened tensor-parallel shard, with
    1-D views of this rank's fp32 master copy and Adam moments of those elements."""
    start: int
    numel: int
    master: torch.Tensor
    moments: Dict[str, torch.Tensor]
    weight: Optional[torch.Tensor] = None  # 1-D low-precision copy to refresh on load (ZeRO-3)


@dataclass
class LocalParam:
    name: str                 # GPTModel name at TP=1, PP=1 (the same in every layout)
    shape: Tuple[int, ...]    # this TP rank's shape
    partition: Partition
    full: Optional[torch.Tensor] = None  # the whole shard to refresh on load, when held whole
    fragments: List[Fragment] = field(default_factory=list)
    experts: Optional[ExpertSplit] = None  # set for experts split over the expert axis
    writes: Optional[bool] = None  # None: as the rank (RankState.writes); experts differ there


@dataclass
class RankState:
    """Everything one rank contributes to a checkpoint."""
    params: List[LocalParam]
    writes: bool                       # False: a data-parallel replica of what rank dp=0 writes
    coords: RankCoord
    rng: dict
    adam_step: int = 0

    def written(self, p: LocalParam) -> bool:
        """Whether this rank writes p's pieces: a data-parallel replica writes nothing, but
        ranks holding other experts are no replicas of the rank that writes the dense ones."""
        return self.writes if p.writes is None else p.writes
