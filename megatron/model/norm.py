"""The built-in norms (LayerNorm, RMSNorm) with fp32 statistics, through the kernels dispatch
(fused or torch), and `build_norm`: the norm model.normalization names (config/variants.py).
A norm module takes (model section, context) and maps [.., h] -> [.., h]; its weights are the
ones its variant record declares (replicated over TP)."""
from __future__ import annotations

import torch
from torch import nn

from megatron import kernels
from megatron.config import ModelConfig, variants
from megatron.model.context import ModelContext
from megatron.parallel.layers import replicated_param


def norm_class(m: ModelConfig) -> type:
    """The module class of model.normalization (a pipeline layer spec needs the class)."""
    return variants.resolve(variants.of(m, "norm").module)


def build_norm(m: ModelConfig, ctx: ModelContext) -> nn.Module:
    """The decoder layers' norms and the final one."""
    return norm_class(m)(m, ctx)


class RMSNorm(nn.Module):
    def __init__(self, m: ModelConfig, ctx: ModelContext):
        super().__init__()
        self.eps, self.state, self.sel = m.norm_epsilon, ctx.state, ctx.sel
        self.sequence_parallel = ctx.sequence_parallel
        self.weight = nn.Parameter(torch.ones(m.hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = replicated_param(self.weight, self.state, self.sequence_parallel)
        return kernels.rms_norm(x, w, self.eps, self.sel)


class LayerNorm(RMSNorm):
    def __init__(self, m: ModelConfig, ctx: ModelContext):
        super().__init__(m, ctx)
        self.bias = nn.Parameter(torch.zeros(m.hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = replicated_param(self.weight, self.state, self.sequence_parallel)
        b = replicated_param(self.bias, self.state, self.sequence_parallel)
        return kernels.layer_norm(x, w, b, self.eps, self.sel)
