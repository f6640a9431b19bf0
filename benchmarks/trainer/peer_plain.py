"""Plain PyTorch peer: nn.Linear, F.scaled_dot_product_attention, F.cross_entropy; [b, s, h]
activations, learned positions, pre-LayerNorm blocks, one QKV projection, tanh-GeLU 4h MLP,
biases, tied output embedding, no dropout; GPT-2's initialisation."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import facts


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(
            2, 0, 3, 1, 4)  # 3 x [b, heads, s, d]
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class PlainGPT(nn.Module):
    def __init__(self, shape: facts.Shape):
        super().__init__()
        self.wte = nn.Embedding(shape.vocab, shape.hidden)
        self.wpe = nn.Embedding(shape.seq, shape.hidden)
        self.blocks = nn.ModuleList(Block(shape.hidden, shape.heads) for _ in range(shape.layers))
        self.ln_f = nn.LayerNorm(shape.hidden)
        for name, p in self.named_parameters():
            if p.ndim == 2:
                scaled = name.endswith(("proj.weight", "fc2.weight"))
                nn.init.normal_(p, 0.0, facts.INIT_STD / (math.sqrt(2 * shape.layers)
                                                          if scaled else 1.0))
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # [b, s, V]
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1))


def build(shape: facts.Shape):
    torch.manual_seed(0)
    model = PlainGPT(shape)
    return model, lambda m, tokens, labels: m(tokens, labels)
