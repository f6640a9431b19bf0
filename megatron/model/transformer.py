"""One pre-norm decoder layer: x + attn(norm1(x)), then + mlp(norm2(x)); with
model.residual.post_norms each output normalised again before it is added (Gemma 2 and 3); on a
MoE layer (config/moe.is_moe_layer) the MLP is a MoE layer (model/moe/)."""
from __future__ import annotations

import functools

from torch import nn

from megatron.config import ModelConfig
from megatron.config.moe import is_moe_layer
from megatron.model.attention import SelfAttention
from megatron.model.context import ModelContext
from megatron.model.mlp import MLP
from megatron.model.moe import MoELayer
from megatron.model.norm import build_norm
from megatron.parallel.checkpointing import recompute
from megatron.parallel.random import dropout


class TransformerLayer(nn.Module):
    def __init__(self, m: ModelConfig, ctx: ModelContext, layer_number: int):
        super().__init__()
        self.seq_par, self.tracker, self.p = ctx.sequence_parallel, ctx.tracker, m.hidden_dropout
        self.recompute = ctx.recompute == "full"
        self.norm1 = build_norm(m, ctx)
        self.attention = SelfAttention(m, ctx, layer_number)
        self.norm2 = build_norm(m, ctx)
        self.mlp = MoELayer(m, ctx, layer_number) if is_moe_layer(m, layer_number) \
            else MLP(m, ctx, layer_number)
        self.post_attention_norm = self.post_mlp_norm = None
        if m.residual.post_norms:
            self.post_attention_norm, self.post_mlp_norm = build_norm(m, ctx), build_norm(m, ctx)

    def _forward(self, x, docs=None):
        # Under sequence parallelism the residual stream is sharded, so its dropout masks must
        # differ per TP rank; otherwise it is replicated and the masks must agree.
        h = self.attention(self.norm1(x), docs)
        if self.post_attention_norm is not None:
            h = self.post_attention_norm(h)
        x = x + dropout(h, self.p, self.training, self.seq_par, self.tracker)
        h = self.mlp(self.norm2(x))
        if self.post_mlp_norm is not None:
            h = self.post_mlp_norm(h)
        return x + dropout(h, self.p, self.training, self.seq_par, self.tracker)

    def forward(self, x, docs=None):  # [s(/t), b, h] -> same
        """docs: the micro-batch's documents (model/context.Documents), held by the
        recomputation as given."""
        if self.recompute and self.training and x.requires_grad:
            fn = self._forward if docs is None else functools.partial(self._forward, docs=docs)
            return recompute(fn, x, self.tracker)
        return self._forward(x, docs)
