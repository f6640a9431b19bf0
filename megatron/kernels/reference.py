"""Pure-PyTorch references for every fused kernel. Math in fp32, result in the input dtype."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
               eps: float) -> torch.Tensor:
    y = F.layer_norm(x.float(), x.shape[-1:], weight.float(),
                     None if bias is None else bias.float(), eps)
    return y.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def scaled_masked_softmax(scores: torch.Tensor, mask: Optional[torch.Tensor],
                          scale: float) -> torch.Tensor:
    """scores [b, np, sq, sk]; mask broadcastable, True where a position is masked out."""
    s = scores.float() * scale
    if mask is not None:
        s = s.masked_fill(mask, -10000.0)
    return torch.softmax(s, dim=-1).to(scores.dtype)


def scaled_causal_softmax(scores: torch.Tensor, scale: float) -> torch.Tensor:
    """scores [b*np, sq, sk] with sq == sk; position j > i is masked."""
    sq, sk = scores.shape[-2:]
    causal = torch.ones(sq, sk, dtype=torch.bool, device=scores.device).triu_(1)
    s = (scores.float() * scale).masked_fill(causal, float("-inf"))
    return torch.softmax(s, dim=-1).to(scores.dtype)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [s, b, n, d]; cos/sin [s, 1, 1, d] (halves repeated). Rotate-half convention."""
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def bias_gelu(x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """Tanh-approximated GeLU, as GPT-2 and Megatron use."""
    y = x.float() if bias is None else x.float() + bias.float()
    return F.gelu(y, approximate="tanh").to(x.dtype)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)
