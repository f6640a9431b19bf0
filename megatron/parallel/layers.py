"""Tensor-parallel layers. Every weight is initialised as the slice this rank owns of one full
tensor drawn from a seed named by the model, so all layouts start from the same model; each
line of that tensor has its own seed, so a rank draws only the lines it keeps.

Activations are [s, b, h] (sequence first, as Megatron). With sequence parallelism the input and
output of the TP region are sharded along s: [s/t, b, h]. `sequence_parallel` arguments are the
resolved setting (model.ModelContext.sequence_parallel: asked for and TP > 1); with one TP rank
every mapping is the identity, so the flag changes nothing there.

Deferred weight gradients (the zero-bubble pipeline schedule, engine/zero_bubble.py): once
`defer_weight_grads` has given a module's TP layers a WeightGradStore, their backward computes
only the input gradient and leaves the weight-gradient GEMM (and the vocabulary embedding's
scatter-add) in the store, to run later as that micro-batch's W pass. The products are the ones
autograd computes, in the same order, so the gradients keep their bits. Biases keep their
gradient in the backward (a reduction, not a GEMM)."""
from __future__ import annotations

import time
from collections import deque
from typing import Callable, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from megatron.base.faults import device_seconds_per_flop
from megatron.parallel.mappings import (all_gather_first, copy_to_tp_region,
                                        gather_from_tp_region, reduce_from_tp_region,
                                        reduce_scatter_to_sequence_parallel_region,
                                        start_all_gather_first, start_all_reduce,
                                        start_reduce_scatter_first)
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
    same values. Drawn on the CPU in fp32, then moved to torch's default device, so a model
    built under `with torch.device("cuda"):` holds the same values, on that device."""
    lines = shard_lines(shape[dim], rank, size, stride)
    width = shape[1 - dim]
    out = torch.empty(len(lines), width, dtype=torch.float32, device="cpu")
    g = torch.Generator(device="cpu")
    for row, line in zip(out, lines):
        row.normal_(0.0, std, generator=g.manual_seed(line_seed(seed, line)))
    out = out if dim == 0 else out.t().contiguous()
    default = torch.get_default_device()
    return out if default.type == "cpu" else out.to(default)


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


class WeightGradStore:
    """The weight-gradient work of the micro-batches whose backward ran and whose W pass did
    not, oldest first. Between open() and seal() a backward's deferred products join the open
    micro-batch; run() computes the oldest one's and hands them to autograd's accumulation
    (torch.autograd.backward on the parameters), so .grad is summed exactly as a full backward
    would sum it and every gradient hook the optimizer put on a parameter still fires."""

    def __init__(self):
        self._open: Optional[List[Tuple[nn.Parameter, Callable[[], torch.Tensor]]]] = None
        self._sealed: deque = deque()
        self._count = 0

    def put(self, param: nn.Parameter, grad_fn: Callable[[], torch.Tensor]) -> None:
        if self._open is None:  # a backward outside a pipeline B pass: nothing to defer to
            torch.autograd.backward([param], [grad_fn()])
        else:
            self._open.append((param, grad_fn))

    def open(self) -> None:
        self._open = []

    def seal(self) -> int:
        """Closes the open micro-batch; returns its number (0, 1, ... since reset)."""
        self._sealed.append((self._count, self._open))
        self._open = None
        self._count += 1
        return self._count - 1

    def pending(self) -> int:
        return len(self._sealed)

    def sealed(self) -> int:
        """Micro-batches whose B ran since reset."""
        return self._count

    def reset(self) -> None:
        """A new step: numbering from 0, and nothing left of a step that failed part-way."""
        self._open, self._count = None, 0
        self._sealed.clear()

    def run(self, micro_batch: int) -> None:
        number, work = self._sealed.popleft()
        if number != micro_batch:
            raise RuntimeError(f"W pass of micro-batch {micro_batch}, but the oldest pending "
                               f"one is {number}")
        if work:
            params = [param for param, _ in work]
            with torch.no_grad():
                grads = [grad_fn() for _, grad_fn in work]
            torch.autograd.backward(params, grads)


def weight_grad_store(weight: torch.Tensor) -> Optional[WeightGradStore]:
    """The store defer_weight_grads gave `weight`, or None (its gradient is computed in B)."""
    return getattr(weight, "wgrad_store", None)


class _LinearDeferred(torch.autograd.Function):
    """F.linear(x, weight, bias) whose backward returns the input's (and bias's) gradient and
    defers the weight's, with autograd's own products: dx = dy W, dW = dy^T x over the
    flattened tokens, db = the sum of dy over them."""

    @staticmethod
    def forward(ctx, x, weight, bias, store):
        ctx.save_for_backward(x, weight)
        ctx.store, ctx.has_bias = store, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad.matmul(weight) if ctx.needs_input_grad[0] else None
        flat_grad = grad.reshape(-1, grad.shape[-1])
        grad_bias = flat_grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        if ctx.needs_input_grad[1]:
            _weight_grad(ctx.store, weight, grad, x)
        return grad_x, None, grad_bias, None


class _EmbeddingDeferred(torch.autograd.Function):
    """F.embedding(ids, weight) whose weight gradient (the scatter-add of the output gradient
    into the looked-up rows, autograd's embedding_backward) waits in the store."""

    @staticmethod
    def forward(ctx, ids, weight, store):
        ctx.save_for_backward(ids, weight)
        ctx.store = store
        return F.embedding(ids, weight)

    @staticmethod
    def backward(ctx, grad):
        ids, weight = ctx.saved_tensors
        rows = weight.shape[0]
        ctx.store.put(weight, lambda: torch.ops.aten.embedding_backward(
            grad, ids, rows, -1, False, False))
        return None, None, None


# An emulated device's seconds per multiply-add pair (MEGATRON_TEST_DEVICE_GFLOPS, a benchmark
# hook in base/faults.py); None, the rule, leaves linear() as it is.
_DEVICE_S_PER_FLOP = device_seconds_per_flop()


def _device_wait(x: torch.Tensor, weight: torch.Tensor) -> None:
    """Sleeps the emulated device's time for one GEMM of x's tokens with weight."""
    time.sleep(2.0 * x.numel() * weight.shape[0] * _DEVICE_S_PER_FLOP)


def _weight_grad(store: Optional[WeightGradStore], weight: torch.Tensor, grad: torch.Tensor,
                 x: torch.Tensor) -> Optional[torch.Tensor]:
    """dW = dy^T x over the flattened tokens (autograd's product), with the emulated device's
    time for it: computed now and returned without a store, else left in the store (None)."""
    flat_grad, flat_x = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])

    def product() -> torch.Tensor:
        out = flat_grad.t().mm(flat_x)
        if _DEVICE_S_PER_FLOP is not None:
            _device_wait(x, weight)
        return out
    if store is None:
        return product()
    store.put(weight, product)
    return None


class _LinearEmulated(torch.autograd.Function):
    """_LinearDeferred's products (the weight's deferred when a store is given), each followed
    by the emulated device's time for it."""

    @staticmethod
    def forward(ctx, x, weight, bias, store):
        ctx.save_for_backward(x, weight)
        ctx.store, ctx.has_bias = store, bias is not None
        out = F.linear(x, weight, bias)
        _device_wait(x, weight)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = grad.matmul(weight)
            _device_wait(x, weight)
        flat_grad = grad.reshape(-1, grad.shape[-1])
        grad_bias = flat_grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        grad_w = _weight_grad(ctx.store, weight, grad, x) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, grad_bias, None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
    """F.linear, with the weight's gradient deferred when the weight has a store."""
    store = weight_grad_store(weight)
    if _DEVICE_S_PER_FLOP is not None:
        if not torch.is_grad_enabled():
            _device_wait(x, weight)
            return F.linear(x, weight, bias)
        return _LinearEmulated.apply(x, weight, bias, store)
    if store is None or not torch.is_grad_enabled():
        return F.linear(x, weight, bias)
    return _LinearDeferred.apply(x, weight, bias, store)


# What _ColumnLinear's backward does, in order, when set to a list (tests read it): "start" (the
# collective), "weight" (the weight gradient computed or deferred), "wait".
_TRACE: Optional[List[str]] = None


def _trace(event: str) -> None:
    if _TRACE is not None:
        _TRACE.append(event)


class _ColumnLinear(torch.autograd.Function):
    """The entry of the TP region and a column-parallel GEMM in one function, so that the
    backward can overlap them. Forward: the input as it is (all-gathered along the sequence
    under SP) times this rank's rows of the weight; under SP only this rank's shard of the input
    is kept, and the backward gathers it again under the input gradient's GEMM (as Megatron-LM
    does: the layer keeps s/t of the tokens, not s). Backward: the input gradient dy W, then its
    all-reduce across TP (reduce-scatter along the sequence under SP) started asynchronously,
    then the weight and bias gradients (the weight's deferred to its store under the zero-bubble
    schedule) while it runs, then the wait; with overlap off the wait comes before the weight
    gradient. The products are _LinearDeferred's and the collectives copies or the sums
    copy_to_tp_region / gather_from_sequence_parallel_region run, so the gradients keep their
    bits."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, sequence_parallel, store, overlap):
        full = all_gather_first(x, group) if sequence_parallel else x
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.sequence_parallel, ctx.overlap = group, sequence_parallel, overlap
        ctx.store, ctx.has_bias = store, bias is not None
        out = F.linear(full, weight, bias)
        if _DEVICE_S_PER_FLOP is not None:
            _device_wait(full, weight)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        full, gather = x, None
        if ctx.sequence_parallel and ctx.needs_input_grad[1]:
            full, gather = start_all_gather_first(x, ctx.group)
        grad_x = work = None
        if ctx.needs_input_grad[0]:
            grad_x = grad.matmul(weight)
            if _DEVICE_S_PER_FLOP is not None:
                _device_wait(grad, weight.t())  # tokens x out x in, as the forward's
        if gather is not None:
            gather.wait()
        if grad_x is not None:
            start = start_reduce_scatter_first if ctx.sequence_parallel else start_all_reduce
            grad_x, work = start(grad_x, ctx.group)
            _trace("start")
            if not ctx.overlap:
                work.wait()
                _trace("wait")
                work = None
        flat_grad = grad.reshape(-1, grad.shape[-1])
        grad_bias = flat_grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = _weight_grad(ctx.store, weight, grad, full)
            _trace("weight")
        if work is not None:
            work.wait()
            _trace("wait")
        return grad_x, grad_w, grad_bias, None, None, None, None


def column_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                  group, sequence_parallel: bool, overlap: bool = True) -> torch.Tensor:
    """A column-parallel GEMM on the TP region's input x ([s/t, b, h] under SP, else [s, b, h]):
    copy_to_tp_region (or the SP all-gather) then linear(); overlap: the backward's collective
    under the weight gradient (_ColumnLinear; parallel.tp_backward_overlap)."""
    if group is None or dist.get_world_size(group) == 1:
        return linear(x, weight, bias)
    return _ColumnLinear.apply(x, weight, bias, group, sequence_parallel,
                               weight_grad_store(weight), overlap)


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    store = weight_grad_store(weight)
    if store is None or not torch.is_grad_enabled():
        return F.embedding(ids, weight)
    return _EmbeddingDeferred.apply(ids, weight, store)


def defer_weight_grads(module: nn.Module, store: WeightGradStore) -> int:
    """Gives the weights of `module`'s TP layers (column-, row-parallel linear, vocabulary
    embedding and the output head that reuses one), and those a module names in
    `deferrable_weights` (a MoE layer's stacked experts, model/moe/experts.py), to `store`;
    returns how many layers."""
    count = 0
    for sub in module.modules():
        if isinstance(sub, (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)):
            sub.weight.wgrad_store = store
            count += 1
        elif getattr(sub, "deferrable_weights", None):
            for name in sub.deferrable_weights:
                getattr(sub, name).wgrad_store = store
            count += 1
    return count


class ColumnParallelLinear(nn.Module):
    """Y = X A^T + b with A split along its output rows: each rank computes Y[..., its columns]."""

    def __init__(self, in_features: int, out_features: int, state: ParallelState, *,
                 bias: bool = True, gather_output: bool = False, sequence_parallel: bool = False,
                 skip_bias_add: bool = False, init_std: float = 0.02, init_seed: int = 0,
                 stride: int = 1, overlap_backward: bool = True):
        super().__init__()
        if out_features % state.tp:
            raise ValueError(f"output size {out_features} is not divisible by TP={state.tp}")
        self.state, self.gather_output = state, gather_output
        self.overlap_backward = overlap_backward  # parallel.tp_backward_overlap
        self.sequence_parallel = sequence_parallel
        self.skip_bias_add = skip_bias_add
        weight = sharded_normal((out_features, in_features), init_std, init_seed, 0,
                                state.tp_rank, state.tp, stride)
        self.weight = mark_tp(nn.Parameter(weight), 0, stride)
        self.bias = mark_tp(nn.Parameter(torch.zeros(out_features // state.tp)), 0,
                            stride) if bias else None

    def forward(self, x: torch.Tensor):
        group = self.state.tp_group
        bias = None if self.skip_bias_add else self.bias
        y = column_linear(x, self.weight, bias, group, self.sequence_parallel,
                          self.overlap_backward)  # [s, b, out/t]
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
        y = linear(x, self.weight)  # partial sums over this rank's input slice
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
            return embedding(ids, self.weight)
        outside = (ids < self.vocab_start) | (ids >= self.vocab_end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        out = embedding(local, self.weight)
        return out.masked_fill(outside.unsqueeze(-1), 0.0)


def parallel_lm_logits(hidden: torch.Tensor, weight: torch.Tensor, state: ParallelState,
                       sequence_parallel: bool, bias: Optional[torch.Tensor] = None,
                       overlap_backward: bool = True):
    """hidden [s(/t), b, h] -> this rank's vocabulary slice of the logits [s, b, V/t]."""
    return column_linear(hidden, weight, bias, state.tp_group, sequence_parallel,
                         overlap_backward)
