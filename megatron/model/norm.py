"""LayerNorm and RMSNorm with fp32 statistics, through the kernels dispatch (fused or torch)."""
from __future__ import annotations

import torch
from torch import nn

from megatron import kernels
from megatron.config import ModelConfig
from megatron.model.context import ModelContext
from megatron.parallel.layers import replicated_param


class Norm(nn.Module):
    """model.normalization over the hidden size; the decoder layers' norms and the final one."""

    def __init__(self, m: ModelConfig, ctx: ModelContext):
        super().__init__()
        self.kind, self.eps = m.normalization, m.norm_epsilon
        self.state, self.sel = ctx.state, ctx.sel
        self.sequence_parallel = ctx.sequence_parallel
        self.weight = nn.Parameter(torch.ones(m.hidden_size))
        self.bias = nn.Parameter(torch.zeros(m.hidden_size)) if self.kind == "layernorm" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = replicated_param(self.weight, self.state, self.sequence_parallel)
        if self.kind == "rmsnorm":
            return kernels.rms_norm(x, w, self.eps, self.sel)
        b = replicated_param(self.bias, self.state, self.sequence_parallel)
        return kernels.layer_norm(x, w, b, self.eps, self.sel)
