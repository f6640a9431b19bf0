"""Causal self-attention with tensor parallelism over heads and grouped-query attention.

Backends: flash (flash-attn on a GPU), sdpa (torch scaled_dot_product_attention), math (explicit
scores with the fused scaled causal softmax). The fused QKV weight is laid out per key/value group
as [q heads of the group, k, v], so a contiguous TP slice holds whole groups.

Under context parallelism (parallel/ulysses.py) the layer sees its rank's slice of the sequence;
q, k and v are exchanged for whole-sequence heads before rotary positions and the backend, so
positions are global and every backend sees the causal mask of the whole sequence."""
from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F
from torch import nn

from megatron import kernels
from megatron.config import ModelConfig
from megatron.config.errors import ConfigError
from megatron.model.context import ModelContext
from megatron.parallel.checkpointing import recompute
from megatron.parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.parallel.random import seed_for
from megatron.parallel import ulysses
from megatron.model.rotary import RotaryEmbedding

log = logging.getLogger(__name__)


def flash_attn_func_or_none():
    try:
        from flash_attn import flash_attn_func
        return flash_attn_func
    except Exception:  # ImportError, or a binary built for another torch/GPU
        return None


def resolve_attention_backend(requested: str, device: torch.device, precision: str) -> str:
    flash_ok = device.type == "cuda" and precision in ("bf16", "fp16") and \
        flash_attn_func_or_none() is not None
    if requested == "flash" and not flash_ok:
        raise ConfigError("model.attention_backend", "flash",
                          "a backend that can run here: flash-attn needs a GPU, bf16/fp16 and the "
                          "flash_attn package", "use model.attention_backend=auto or sdpa")
    if requested != "auto":
        return requested
    choice = "flash" if flash_ok else "sdpa"
    log.info("attention backend: auto chose %s%s", choice,
             "" if flash_ok else " (flash-attn unavailable: needs a GPU, bf16/fp16, flash_attn)")
    return choice


class SelfAttention(nn.Module):
    def __init__(self, m: ModelConfig, ctx: ModelContext, layer_number: int):
        super().__init__()
        state, seq_par = ctx.state, ctx.sequence_parallel
        self.state, self.sel, self.tracker, self.backend = state, ctx.sel, ctx.tracker, ctx.backend
        self.head_dim = m.head_dim
        self.groups_local = m.kv_heads // state.tp
        self.q_per_group = m.num_attention_heads // m.kv_heads
        self.dropout = m.attention_dropout
        self.selective = ctx.recompute == "selective"
        self.cp, self.cp_group = state.cp, state.cp_group
        self.kv_replicas = ulysses.kv_replicas(self.groups_local, self.q_per_group, state.cp)
        qkv_out = (m.num_attention_heads + 2 * m.kv_heads) * m.head_dim
        seed, std = ctx.seed, m.init_method_std
        self.qkv = ColumnParallelLinear(m.hidden_size, qkv_out, state, bias=m.add_bias_linear,
                                        sequence_parallel=seq_par, init_std=std,
                                        init_seed=seed_for(seed, f"layer{layer_number}.qkv"))
        # Output projection scaled by 1/sqrt(2L) (GPT-2 / Megatron) to keep the residual stable.
        self.dense = RowParallelLinear(m.num_attention_heads * m.head_dim, m.hidden_size, state,
                                       bias=m.add_bias_linear, sequence_parallel=seq_par,
                                       init_std=std / math.sqrt(2 * m.num_layers),
                                       init_seed=seed_for(seed, f"layer{layer_number}.proj"))
        self.rotary = RotaryEmbedding(m.head_dim, m.rotary_base, m.max_position_embeddings) \
            if m.position_embedding_type == "rotary" else None

    def _split(self, qkv: torch.Tensor):
        s, b = qkv.shape[:2]
        g, d = self.q_per_group, self.head_dim
        qkv = qkv.view(s, b, self.groups_local, g + 2, d)
        q = qkv[:, :, :, :g].reshape(s, b, self.groups_local * g, d)
        k, v = qkv[:, :, :, g], qkv[:, :, :, g + 1]  # [s, b, groups, d]
        return q, k, v

    def _core(self, qkv: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(qkv)  # [s(/C), b, heads, d]
        if self.cp > 1:  # [s/C, b, heads, d] -> [s, b, heads/C, d]
            q, k, v = ulysses.scatter_heads(q, k, v, self.cp_group, self.cp, self.kv_replicas)
        if self.rotary is not None:
            q, k = self.rotary.apply(q, self.sel), self.rotary.apply(k, self.sel)
        out = self._attend(q, k, v)  # [s, b, heads(/C)*d]
        if self.cp > 1:
            out = ulysses.gather_heads(out, self.cp_group, self.cp)  # [s/C, b, heads*d]
        return out

    def _attend(self, q, k, v) -> torch.Tensor:
        s, b, n, d = q.shape
        gqa = n > k.shape[2]
        p = self.dropout if self.training else 0.0
        if self.backend == "flash":
            fn = flash_attn_func_or_none()
            with self.tracker.fork("tp"):
                out = fn(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), dropout_p=p,
                         causal=True)  # [b, s, n, d]
            return out.transpose(0, 1).reshape(s, b, n * d)
        if self.backend == "sdpa":
            qt, kt, vt = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # [b, heads, s, d]
            with self.tracker.fork("tp"):
                out = F.scaled_dot_product_attention(qt, kt, vt, dropout_p=p, is_causal=True,
                                                     enable_gqa=gqa)
            return out.permute(2, 0, 1, 3).reshape(s, b, n * d)
        return self._math(q, k, v)

    def _math(self, q, k, v) -> torch.Tensor:
        s, b, n, d = q.shape
        if n > k.shape[2]:
            rep = n // k.shape[2]
            k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        qb = q.permute(1, 2, 0, 3).reshape(b * n, s, d)
        kb = k.permute(1, 2, 3, 0).reshape(b * n, d, s)
        vb = v.permute(1, 2, 0, 3).reshape(b * n, s, d)
        probs = kernels.scaled_causal_softmax(torch.bmm(qb, kb), 1.0 / math.sqrt(d), self.sel)
        if self.training and self.dropout > 0:
            with self.tracker.fork("tp"):
                probs = F.dropout(probs, self.dropout, True)
        out = torch.bmm(probs, vb)  # [b*n, s, d]
        return out.view(b, n, s, d).permute(2, 0, 1, 3).reshape(s, b, n * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)  # [s, b, groups*(g+2)*d]
        if self.selective and self.training:
            ctx = recompute(self._core, qkv, self.tracker)
        else:
            ctx = self._core(qkv)
        return self.dense(ctx)
