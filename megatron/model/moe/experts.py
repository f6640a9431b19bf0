"""The experts of one MoE layer on this rank: E / EP MLPs of the model's activation
(config/variants.py: fc1 -> act -> fc2, fc1 fc1_factor x ffn wide), their weights stacked
[E_local, ...] and marked as split over the expert axis (mark_experts), so checkpoints and the
engine can tell them from replicated weights.

Two ways to run them, the same products: a loop over the local experts, and torch._grouped_mm,
one grouped GEMM per matrix, used wherever this torch has it (CPU and GPUs). The CPU grouped
GEMM's backward (torch 2.13) refuses a gradient with zero strides (what `.sum().backward()`
hands it: "Invalid strides/sizes"), so its output passes its gradient on contiguous
(_ContiguousGrad). On the CPU it is 2-3x faster than the loop (benchmarks/results/
moe_layer.md); both are tested against each other (tests/unit/test_model_moe_routing.py).

Which dtypes and shapes the grouped GEMM takes differs by device and torch version (CUDA's
kernel has been bf16-only, with rows 16-byte aligned, in some releases), so the first call for
each (device type, dtype, widths) tries it once on a few rows, forward and backward
(grouped_gemm_works); where it raises, that layer runs the loop, with one warning naming why.
The answer is cached: later calls pay a dictionary lookup.

Under a schedule that splits the backward (ZB-H1, ZB-V: parallel/layers.defer_weight_grads)
the stacked weights w1 and w2 are deferred like a TP layer's (`deferrable_weights`): the B pass
computes the input's gradient, and the weights' products, dW_e = dy_e^T x_e for each local
expert's rows, wait in the chunk's WeightGradStore for its W pass (_ExpertLinear), one grouped
GEMM per matrix where the layer runs grouped (bit-identical to the loop on the CPU). The biases'
gradients (a row sum) stay in B."""
from __future__ import annotations

import logging
import math
from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from megatron.config import moe, variants
from megatron.model.moe.dispatch import select_rows
from megatron.parallel.layers import sharded_normal, weight_grad_store
from megatron.parallel.random import seed_for

log = logging.getLogger(__name__)

# (device type, dtype, h, fc1 width, ffn) -> None when the grouped GEMM ran, else why not.
_GROUPED_PROBES: Dict[Tuple, object] = {}


def grouped_gemm_works(device: torch.device, dtype: torch.dtype, h: int, f1: int, f: int):
    """None when torch._grouped_mm runs this layer's two products forward and backward on
    `device` in `dtype` (tried once on 2 experts x 8 rows, then cached), else the reason."""
    key = (device.type, dtype, h, f1, f)
    if key not in _GROUPED_PROBES:
        why = None
        if not hasattr(torch, "_grouped_mm"):
            why = f"this torch ({torch.__version__}) has no torch._grouped_mm"
        else:
            try:
                with torch.enable_grad():
                    x = torch.zeros(16, h, device=device, dtype=dtype, requires_grad=True)
                    w1 = torch.zeros(2, f1, h, device=device, dtype=dtype, requires_grad=True)
                    w2 = torch.zeros(2, h, f, device=device, dtype=dtype, requires_grad=True)
                    offs = torch.tensor([8, 16], device=device, dtype=torch.int32)
                    y = torch._grouped_mm(x, w1.transpose(1, 2), offs=offs)[:, :f]
                    y = torch._grouped_mm(y.contiguous(), w2.transpose(1, 2), offs=offs)
                    y.backward(torch.ones_like(y))
            except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
                why = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        if why is not None:
            log.warning("MoE experts: the grouped GEMM does not run on %s in %s for hidden %d, "
                        "fc1 %d, ffn %d (%s); using the per-expert loop", device.type,
                        str(dtype).replace("torch.", ""), h, f1, f, why)
        _GROUPED_PROBES[key] = why
    return _GROUPED_PROBES[key]


def mark_experts(param: nn.Parameter, num_experts: int, first: int,
                 writer: bool = True) -> nn.Parameter:
    """`param` holds experts [first, first + its dim 0) of num_experts, along dim 0; writer:
    this rank is the first of the ranks holding them (edp index 0), the one that writes them
    to a checkpoint when their state is replicated."""
    param.expert_dim, param.num_experts, param.first_expert = 0, num_experts, first
    param.expert_writer = writer
    return param


def _stack(shape, std: float, seed: int, layer: int, name: str, experts: range) -> torch.Tensor:
    """Each expert's matrix from its own seeded stream: the same weights in every layout."""
    return torch.stack([sharded_normal(shape, std, seed_for(seed, f"layer{layer}.expert{e}.{name}"))
                        for e in experts])


class Experts(nn.Module):
    def __init__(self, m, ctx, layer_number: int, first: int, count: int):
        super().__init__()
        spec = variants.of(m, "activation")
        self.act, self.sel = variants.resolve(spec.module), ctx.sel
        h, f, local = m.hidden_size, moe.expert_ffn(m), range(first, first + count)
        std2 = m.init_method_std / math.sqrt(2 * m.num_layers)
        self.w1 = nn.Parameter(_stack((spec.fc1_factor * f, h), m.init_method_std, ctx.seed,
                                      layer_number, "fc1", local))  # [E_local, fc1_factor*f, h]
        self.w2 = nn.Parameter(_stack((h, f), std2, ctx.seed, layer_number, "fc2", local))
        self.b1 = nn.Parameter(torch.zeros(count, spec.fc1_factor * f)) \
            if m.add_bias_linear else None
        self.b2 = nn.Parameter(torch.zeros(count, h)) if m.add_bias_linear else None
        writer = ctx.expert is None or ctx.expert.grid.index(ctx.expert.rank, "edp") == 0
        for p in self.parameters():
            mark_experts(p, m.moe.num_experts, first, writer)
        self.grouped = None  # None: the grouped GEMM where it runs (grouped_gemm_works), else
        # the loop; True or False forces one (tests, benchmarks)

    # what parallel/layers.defer_weight_grads hands a WeightGradStore under ZB-H1 and ZB-V
    deferrable_weights = ("w1", "w2")

    def forward(self, x: torch.Tensor, counts: List[int]) -> torch.Tensor:
        """x [M, h] grouped by local expert, counts [E_local] -> [M, h]."""
        grouped = self.grouped
        if grouped is None:  # the default: grouped wherever it runs (grouped_gemm_works)
            f1, h = self.w1.shape[1:]
            grouped = grouped_gemm_works(x.device, x.dtype, h, f1, self.w2.shape[2]) is None
        if grouped and hasattr(torch, "_grouped_mm"):
            return self._grouped(x, counts)
        return self._loop(x, counts)

    def _loop(self, x: torch.Tensor, counts: List[int]) -> torch.Tensor:
        # unbind, not w1[e] per expert: each indexing's backward would write a zero tensor of
        # the whole stack and add it up, E times; unbind's backward stacks the E gradients once.
        b1 = self.b1.unbind(0) if self.b1 is not None else [None] * len(counts)
        b2 = self.b2.unbind(0) if self.b2 is not None else [None] * len(counts)
        store = weight_grad_store(self.w1)
        if store is not None:  # the weights' products deferred (_ExpertLinear)
            y = _ExpertLinear.apply(x, self.w1, counts, None, store)
            y = torch.cat([self.act(part, b1[e], self.sel)
                           for e, part in enumerate(y.split(counts))]) if counts else y
            y = _ExpertLinear.apply(y, self.w2, counts, None, weight_grad_store(self.w2))
            if self.b2 is not None:
                y = y + torch.cat([b.expand(n, -1) for b, n in zip(b2, counts)])
            return y
        w1, w2 = self.w1.unbind(0), self.w2.unbind(0)
        out = []
        for e, rows in enumerate(x.split(counts)):
            y = F.linear(rows, w1[e])  # [n_e, fc1_factor*f]
            y = self.act(y, b1[e], self.sel)  # [n_e, f]
            out.append(F.linear(y, w2[e], b2[e]))  # [n_e, h]
        return torch.cat(out) if out else x.new_zeros((0, x.shape[-1]))

    def _grouped(self, x: torch.Tensor, counts: List[int]) -> torch.Tensor:
        offs = torch.tensor(counts, device=x.device).cumsum(0).to(torch.int32)
        which = torch.repeat_interleave(torch.arange(len(counts), device=x.device),
                                        torch.tensor(counts, device=x.device))  # expert of row
        y = _grouped_linear(x, self.w1, counts, offs)  # [M, fc1_factor*f]
        if self.b1 is not None:  # per row, before the activation (the fused ops take [f] biases)
            y = y + select_rows(self.b1, which)
        y = self.act(y, None, self.sel)
        y = _grouped_linear(y, self.w2, counts, offs)  # [M, h]
        y = _ContiguousGrad.apply(y)
        return y if self.b2 is None else y + select_rows(self.b2, which)


class _ContiguousGrad(torch.autograd.Function):
    """Forward: identity. Backward: the gradient made contiguous, for the grouped GEMM's
    backward, which refuses a broadcast (zero-stride) gradient on the CPU."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def _grouped_linear(x: torch.Tensor, weight: torch.Tensor, counts: List[int],
                    offs: torch.Tensor) -> torch.Tensor:
    """x_e w[e]^T for each expert's rows in one grouped GEMM: autograd's own, or with the
    weight's product deferred (_ExpertLinear) where defer_weight_grads gave it a store."""
    store = weight_grad_store(weight)
    if store is not None:
        return _ExpertLinear.apply(x, weight, counts, offs, store)
    return torch._grouped_mm(x, weight.transpose(1, 2), offs=offs)


class _ExpertLinear(torch.autograd.Function):
    """y_e = x_e w[e]^T for each local expert's rows (x grouped by expert, `counts` rows each):
    one grouped GEMM where `offs` (the rows' cumulative counts) is given, else a loop. The
    backward returns dx_e = dy_e w[e] and leaves dW_e = dy_e^T x_e (zero for an expert without
    rows) in `store` for the W pass (parallel/layers.WeightGradStore): with `offs` one grouped
    GEMM for all of them, else a loop."""

    @staticmethod
    def forward(ctx, x, weight, counts, offs, store):
        ctx.save_for_backward(x, weight)
        ctx.counts, ctx.offs, ctx.store = counts, offs, store
        if offs is not None:
            return torch._grouped_mm(x, weight.transpose(1, 2), offs=offs)
        parts = [F.linear(rows, w) for rows, w in zip(x.split(counts), weight.unbind(0))]
        return torch.cat(parts) if parts else x.new_zeros((0, weight.shape[1]))

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        counts, offs = ctx.counts, ctx.offs
        grad = grad.contiguous()  # the CPU grouped GEMM refuses zero strides
        if offs is not None:
            grad_x = torch._grouped_mm(grad, weight, offs=offs)
        else:
            parts = [g.mm(w) for g, w in zip(grad.split(counts), weight.unbind(0))]
            grad_x = torch.cat(parts) if parts else x.new_zeros((0, weight.shape[2]))

        def product() -> torch.Tensor:
            if offs is not None:  # dy^T x grouped along the rows: the form autograd's own
                # backward of the grouped GEMM takes (so grouped_gemm_works has tried it)
                return torch._grouped_mm(grad.t(), x, offs=offs)
            return torch.stack([g.t().mm(rows) for g, rows in zip(grad.split(counts),
                                                                   x.split(counts))])
        if ctx.needs_input_grad[1]:
            ctx.store.put(weight, product)
        return grad_x, None, None, None, None
