"""Feed-forward block: GeLU (fc1 -> gelu -> fc2) or SwiGLU (fc1 = [gate; up] -> silu(gate)*up)."""
from __future__ import annotations

import math

from torch import nn

from megatron import kernels
from megatron.config import ModelConfig
from megatron.model.context import ModelContext
from megatron.parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.parallel.random import seed_for


class MLP(nn.Module):
    def __init__(self, m: ModelConfig, ctx: ModelContext, layer_number: int):
        super().__init__()
        state, seq_par, seed = ctx.state, ctx.sequence_parallel, ctx.seed
        self.swiglu, self.sel = m.activation == "swiglu", ctx.sel
        width = 2 * m.ffn_hidden_size if self.swiglu else m.ffn_hidden_size
        # stride 2 for SwiGLU: each rank holds its slice of gate and its slice of up.
        self.fc1 = ColumnParallelLinear(m.hidden_size, width, state, bias=m.add_bias_linear,
                                        sequence_parallel=seq_par, skip_bias_add=True,
                                        init_std=m.init_method_std,
                                        init_seed=seed_for(seed, f"layer{layer_number}.fc1"),
                                        stride=2 if self.swiglu else 1)
        self.fc2 = RowParallelLinear(m.ffn_hidden_size, m.hidden_size, state,
                                     bias=m.add_bias_linear, sequence_parallel=seq_par,
                                     init_std=m.init_method_std / math.sqrt(2 * m.num_layers),
                                     init_seed=seed_for(seed, f"layer{layer_number}.fc2"))

    def forward(self, x):
        y, bias = self.fc1(x)  # [s, b, width/t]
        if self.swiglu:
            if bias is not None:
                y = y + bias
            gate, up = y.chunk(2, dim=-1)
            y = kernels.swiglu(gate, up, self.sel)
        else:
            y = kernels.bias_gelu(y, bias, self.sel)
        return self.fc2(y)
