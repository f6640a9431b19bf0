"""LayerNorm and RMSNorm with fp32 statistics, through the kernels dispatch (fused or torch)."""
from __future__ import annotations

import torch
from torch import nn

from megatron import kernels
from megatron.parallel.layers import replicated_param
from megatron.parallel.state import ParallelState


class Norm(nn.Module):
    def __init__(self, kind: str, hidden: int, eps: float, state: ParallelState,
                 sequence_parallel: bool, sel: kernels.KernelSelection):
        super().__init__()
        self.kind, self.eps, self.state, self.sel = kind, eps, state, sel
        self.sequence_parallel = sequence_parallel
        self.weight = nn.Parameter(torch.ones(hidden))
        self.bias = nn.Parameter(torch.zeros(hidden)) if kind == "layernorm" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = replicated_param(self.weight, self.state, self.sequence_parallel)
        if self.kind == "rmsnorm":
            return kernels.rms_norm(x, w, self.eps, self.sel)
        b = replicated_param(self.bias, self.state, self.sequence_parallel)
        return kernels.layer_norm(x, w, b, self.eps, self.sel)
