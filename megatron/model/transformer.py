"""One pre-norm decoder layer: x + attn(norm1(x)), then + mlp(norm2(x))."""
from __future__ import annotations

from torch import nn

from megatron.model.attention import SelfAttention
from megatron.model.mlp import MLP
from megatron.model.norm import Norm
from megatron.parallel.checkpointing import recompute
from megatron.parallel.random import dropout


class TransformerLayer(nn.Module):
    def __init__(self, cfg, state, layer_number: int, backend: str, sel, tracker):
        super().__init__()
        m = cfg.model
        seq_par = cfg.parallel.sequence_parallel and state.tp > 1
        self.seq_par, self.tracker, self.p = seq_par, tracker, m.hidden_dropout
        self.recompute = cfg.training.activation_checkpointing == "full"
        self.norm1 = Norm(m.normalization, m.hidden_size, m.norm_epsilon, state, seq_par, sel)
        self.attention = SelfAttention(cfg, state, layer_number, backend, sel, tracker)
        self.norm2 = Norm(m.normalization, m.hidden_size, m.norm_epsilon, state, seq_par, sel)
        self.mlp = MLP(cfg, state, layer_number, sel)

    def _forward(self, x):
        # Under sequence parallelism the residual stream is sharded, so its dropout masks must
        # differ per TP rank; otherwise it is replicated and the masks must agree.
        h = dropout(self.attention(self.norm1(x)), self.p, self.training, self.seq_par,
                    self.tracker)
        x = x + h
        h = dropout(self.mlp(self.norm2(x)), self.p, self.training, self.seq_par, self.tracker)
        return x + h

    def forward(self, x):  # [s(/t), b, h] -> same
        if self.recompute and self.training and x.requires_grad:
            return recompute(self._forward, x, self.tracker)
        return self._forward(x)
