"""The built-in norms (LayerNorm, RMSNorm) with fp32 statistics, through the kernels dispatch
(fused or torch), and `build_norm`: the norm model.normalization names (config/variants.py).
A norm module takes (model section, context) and maps [.., h] -> [.., h]; its weights are the
ones its variant record declares (replicated over TP). Under model.attention.qk_norm the
attention builds it again per query and key head: `(m, ctx, width=head width, per_rank=True)`,
where per_rank says each tensor-parallel rank normalises other heads, so the weights' gradients
are summed over TP."""
from __future__ import annotations

import inspect
from typing import Optional

import torch
from torch import nn

from megatron import kernels
from megatron.config import ModelConfig, variants
from megatron.config.errors import ConfigError
from megatron.model.context import ModelContext
from megatron.parallel.layers import replicated_param


def norm_class(m: ModelConfig) -> type:
    """The module class of model.normalization (a pipeline layer spec needs the class)."""
    return variants.resolve(variants.of(m, "norm").module)


def build_norm(m: ModelConfig, ctx: ModelContext) -> nn.Module:
    """The decoder layers' norms and the final one."""
    return norm_class(m)(m, ctx)


def takes_width(cls: type) -> bool:
    """Whether a norm module can be built per head (model.attention.qk_norm): its constructor
    takes the `width` and `per_rank` keywords."""
    params = inspect.signature(cls.__init__).parameters
    return {"width", "per_rank"} <= set(params) or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def head_norm_class(m: ModelConfig) -> type:
    """model.normalization's module, built per query and key head (model.attention.qk_norm)."""
    cls = norm_class(m)
    if not takes_width(cls):
        raise ConfigError("model.attention.qk_norm", True,
                          f"a norm that can be built per head: model.normalization="
                          f"{m.normalization}'s module {cls.__name__} does not take the width= "
                          f"and per_rank= keywords (model/norm.py); add them to it, or set "
                          f"model.attention.qk_norm=false")
    return cls


class RMSNorm(nn.Module):
    def __init__(self, m: ModelConfig, ctx: ModelContext, width: Optional[int] = None,
                 per_rank: bool = False):
        super().__init__()
        self.eps, self.state, self.sel = m.norm_epsilon, ctx.state, ctx.sel
        # Each rank's inputs differ (sequence shards, or its own heads): gradients summed over TP.
        self.sequence_parallel = ctx.sequence_parallel or per_rank
        self.weight = nn.Parameter(torch.ones(width or m.hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = replicated_param(self.weight, self.state, self.sequence_parallel)
        return kernels.rms_norm(x, w, self.eps, self.sel)


class LayerNorm(RMSNorm):
    def __init__(self, m: ModelConfig, ctx: ModelContext, width: Optional[int] = None,
                 per_rank: bool = False):
        super().__init__(m, ctx, width, per_rank)
        self.bias = nn.Parameter(torch.zeros(width or m.hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = replicated_param(self.weight, self.state, self.sequence_parallel)
        b = replicated_param(self.bias, self.state, self.sequence_parallel)
        return kernels.layer_norm(x, w, b, self.eps, self.sel)
