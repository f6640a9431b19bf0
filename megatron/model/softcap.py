"""Gemma 2's softcapping, the one formula of its two caps: the attention scores'
(model.attention.logit_softcapping: the math core, the blockwise attention of ring, all-gather
and hybrid context parallelism) and the logits' (model.output.logit_softcapping: both output
heads). flash-attn applies the scores' cap inside its kernel (its softcap argument)."""
from __future__ import annotations

import torch


def softcapped(x: torch.Tensor, cap: float, scale: float = 1.0) -> torch.Tensor:
    """cap x tanh(x x scale / cap), elementwise: every value within (-cap, cap). The scale is
    taken in the same pass (the attention scores' 1/sqrt(d)); x x scale where cap is 0."""
    if not cap:
        return x if scale == 1.0 else x * scale
    return torch.tanh(x * (scale / cap)) * cap
