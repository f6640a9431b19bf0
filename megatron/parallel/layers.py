"""Tensor-parallel layers. Every weight is initialised as the slice this rank owns of one full
tensor drawn from a seed named by the model, so all layouts start from the same model; each
line of that tensor has its own seed, so a rank draws only the lines it keeps.

Activations are [s, b, h] (sequence first, as Megatron). With sequence parallelism the input and
output of the TP region are sharded along s: [s/t, b, h]. `sequence_parallel` arguments are the
resolved setting (model.ModelContext.sequence_parallel: asked for and TP > 1); with one TP rank
every mapping is the identity, so the flag changes nothing there."""
from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from megatron.parallel.mappings import (copy_to_tp_region, gather_from_sequence_parallel_region,
                                        gather_from_tp_region, reduce_from_tp_region,
                                        reduce_scatter_to_sequence_parallel_region)
from megatron.parallel.state import ParallelState


_MASK64 = (1 << 64) - 1


def line_seed(seed: int, line: int) -> int:
    """The seed of line `line` of the tensor seeded `seed` (SplitMix64 of both, so neighbouring
    lines and neighbouring tensors get unrelated streams)."""
    x = (seed * 0x9E3779B97F4A7C15 + line + 1) & _MASK64
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x = ((x ^ (x >> shift)) * mult) & _MASK64
    return (x ^ (x >> 31)) >> 1  # 63 bits: torch seeds are signed


def shard_lines(length: int, rank: int, size: int, stride: int = 1) -> List[int]:
    """Indices along a dimension of `length` that `shard(..., rank, size, stride)` keeps."""
    block = length // stride
    per = block // size
    return [k * block + i for k in range(stride) for i in range(rank * per, (rank + 1) * per)]


def sharded_normal(shape, std: float, seed: int, dim: int = 0, rank: int = 0, size: int = 1,
                   stride: int = 1) -> torch.Tensor:
    """This rank's slice, `shard(full, dim, rank, size, stride)`, of the full 2-D tensor whose
    line i along `dim` is drawn from its own generator seeded by (seed, i). A rank draws only
    its own lines (1/TP of the tensor, not all of it), and every layout and device gets the
    same values. Drawn on the CPU in fp32."""
    lines = shard_lines(shape[dim], rank, size, stride)
    width = shape[1 - dim]
    out = torch.empty(len(lines), width, dtype=torch.float32)
    g = torch.Generator()
    for row, line in zip(out, lines):
        row.normal_(0.0, std, generator=g.manual_seed(line_seed(seed, line)))
    return out if dim == 0 else out.t().contiguous()


def full_normal(shape, std: float, seed: int, dim: int = 0) -> torch.Tensor:
    """The full (unsharded) tensor of which sharded_normal draws slices; lines along `dim`."""
    return sharded_normal(shape, std, seed, dim)


def shard(full: torch.Tensor, dim: int, rank: int, size: int, stride: int = 1) -> torch.Tensor:
    """This rank's slice of `full` along `dim`. With stride k, `full` is k blocks along dim
    (e.g. [gate; up]) and the rank takes its slice of each block, concatenated."""
    blocks = full.chunk(stride, dim=dim)
    return torch.cat([b.chunk(size, dim=dim)[rank] for b in blocks], dim=dim).contiguous()


def mark_tp(param: nn.Parameter, dim: int, stride: int = 1, vocab: bool = False) -> nn.Parameter:
    """How `param` is split over TP, kept on the parameter itself: checkpoints, merges and
    init_from read it (checkpoint/state.Partition) instead of guessing from names. stride: blocks
    along dim split separately (SwiGLU's [gate; up]); vocab: rows are the padded vocabulary.
    The engine derives DeepSpeed's own markers from these (engine/model.mark_tensor_parallel)."""
    param.partition_dim = dim
    param.partition_stride = stride
    param.vocab_rows = vocab
    return param


def replicated_param(param: nn.Parameter, state: ParallelState, sequence_parallel: bool):
    """A parameter replicated across TP used on sequence shards: each rank sees different tokens,
    so its gradient must be summed across TP (backward all-reduce)."""
    if sequence_parallel:
        return copy_to_tp_region(param, state.tp_group)
    return param


class ColumnParallelLinear(nn.Module):
    """Y = X A^T + b with A split along its output rows: each rank computes Y[..., its columns]."""

    def __init__(self, in_features: int, out_features: int, state: ParallelState, *,
                 bias: bool = True, gather_output: bool = False, sequence_parallel: bool = False,
                 skip_bias_add: bool = False, init_std: float = 0.02, init_seed: int = 0,
                 stride: int = 1):
        super().__init__()
        if out_features % state.tp:
            raise ValueError(f"output size {out_features} is not divisible by TP={state.tp}")
        self.state, self.gather_output = state, gather_output
        self.sequence_parallel = sequence_parallel
        self.skip_bias_add = skip_bias_add
        weight = sharded_normal((out_features, in_features), init_std, init_seed, 0,
                                state.tp_rank, state.tp, stride)
        self.weight = mark_tp(nn.Parameter(weight), 0, stride)
        self.bias = mark_tp(nn.Parameter(torch.zeros(out_features // state.tp)), 0,
                            stride) if bias else None

    def forward(self, x: torch.Tensor):
        group = self.state.tp_group
        if self.sequence_parallel:
            x = gather_from_sequence_parallel_region(x, group)  # [s/t,b,h] -> [s,b,h]
        else:
            x = copy_to_tp_region(x, group)
        bias = None if self.skip_bias_add else self.bias
        y = F.linear(x, self.weight, bias)  # [s, b, out/t]
        if self.gather_output:
            y = gather_from_tp_region(y, group)
        return (y, self.bias) if self.skip_bias_add else y


class RowParallelLinear(nn.Module):
    """Y = X A^T + b with A split along its input columns: each rank holds a partial sum that is
    all-reduced (or reduce-scattered along s under sequence parallelism)."""

    def __init__(self, in_features: int, out_features: int, state: ParallelState, *,
                 bias: bool = True, sequence_parallel: bool = False, init_std: float = 0.02,
                 init_seed: int = 0):
        super().__init__()
        if in_features % state.tp:
            raise ValueError(f"input size {in_features} is not divisible by TP={state.tp}")
        self.state = state
        self.sequence_parallel = sequence_parallel
        weight = sharded_normal((out_features, in_features), init_std, init_seed, 1,
                                state.tp_rank, state.tp)
        self.weight = mark_tp(nn.Parameter(weight), 1)
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)  # partial sums over this rank's input slice
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence_parallel_region(y, self.state.tp_group)
        else:
            y = reduce_from_tp_region(y, self.state.tp_group)
        if self.bias is not None:
            y = y + replicated_param(self.bias, self.state, self.sequence_parallel)
        return y


class VocabParallelEmbedding(nn.Module):
    """Embedding rows split by vocabulary range; returns this rank's partial lookup (zeros for ids
    outside its range). The caller reduces across TP (all-reduce, or reduce-scatter under SP)."""

    def __init__(self, vocab_size: int, hidden: int, state: ParallelState, *,
                 init_std: float = 0.02, init_seed: int = 0):
        super().__init__()
        if vocab_size % state.tp:
            raise ValueError(f"vocabulary {vocab_size} is not divisible by TP={state.tp}")
        self.state = state
        per_rank = vocab_size // state.tp
        self.vocab_start, self.vocab_end = state.tp_rank * per_rank, (state.tp_rank + 1) * per_rank
        weight = sharded_normal((vocab_size, hidden), init_std, init_seed, 0, state.tp_rank,
                                state.tp)
        self.weight = mark_tp(nn.Parameter(weight), 0, vocab=True)

    def partial(self, ids: torch.Tensor) -> torch.Tensor:
        if self.state.tp == 1:
            return F.embedding(ids, self.weight)
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight)
        return out.masked_fill(outside.unsqueeze(-1), 0.0)


def parallel_lm_logits(hidden: torch.Tensor, weight: torch.Tensor, state: ParallelState,
                       sequence_parallel: bool, bias: Optional[torch.Tensor] = None):
    """hidden [s(/t), b, h] -> this rank's vocabulary slice of the logits [s, b, V/t]."""
    if sequence_parallel:
        hidden = gather_from_sequence_parallel_region(hidden, state.tp_group)
    else:
        hidden = copy_to_tp_region(hidden, state.tp_group)
    return F.linear(hidden, weight, bias)
