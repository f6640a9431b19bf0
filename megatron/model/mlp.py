"""Feed-forward block: fc1 -> activation -> fc2, the activation model.activation names
(config/variants.py): GeLU (fc1 -> gelu -> fc2), SwiGLU (fc1 = [gate; up] -> silu(gate)*up) or
GeGLU (gelu(gate)*up).
An activation is a function (y [s, b, fc1_factor*ffn/t], fc1's bias or None, kernel selection)
-> [s, b, ffn/t]; its record says fc1's width in units of ffn_hidden_size."""
from __future__ import annotations

import math

import torch.nn.functional as F
from torch import nn

from megatron import kernels
from megatron.config import ModelConfig, variants
from megatron.model.context import ModelContext
from megatron.parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.parallel.random import seed_for


def bias_gelu(y, bias, sel):
    return kernels.bias_gelu(y, bias, sel)


def _gate_and_up(y, bias):
    """A gated MLP's fc1 output (and bias) as its [gate; up] halves."""
    if bias is not None:
        y = y + bias
    return y.chunk(2, dim=-1)


def bias_swiglu(y, bias, sel):
    return kernels.swiglu(*_gate_and_up(y, bias), sel)


def bias_geglu(y, bias, sel):
    """GeGLU (fc1 = [gate; up] -> gelu(gate) * up, the tanh GeLU): torch's own ops, no fused
    kernel."""
    gate, up = _gate_and_up(y, bias)
    return F.gelu(gate, approximate="tanh") * up


class MLP(nn.Module):
    def __init__(self, m: ModelConfig, ctx: ModelContext, layer_number: int, stream: str = ""):
        """`stream` names a second MLP of a layer (a MoE layer's shared expert) in its weights'
        seed streams, so its initialisation is its own."""
        super().__init__()
        state, seq_par, seed = ctx.state, ctx.sequence_parallel, ctx.seed
        spec = variants.of(m, "activation")
        self.act, self.sel = variants.resolve(spec.module), ctx.sel
        # stride = the factor: each rank holds its slice of every block (SwiGLU's gate and up).
        self.fc1 = ColumnParallelLinear(m.hidden_size, spec.fc1_factor * m.ffn_hidden_size, state,
                                        bias=m.add_bias_linear, sequence_parallel=seq_par,
                                        skip_bias_add=True, init_std=m.init_method_std,
                                        init_seed=seed_for(seed, f"layer{layer_number}.{stream}fc1"),
                                        stride=spec.fc1_factor,
                                        overlap_backward=ctx.tp_backward_overlap)
        self.fc2 = RowParallelLinear(m.ffn_hidden_size, m.hidden_size, state,
                                     bias=m.add_bias_linear, sequence_parallel=seq_par,
                                     init_std=m.init_method_std / math.sqrt(2 * m.num_layers),
                                     init_seed=seed_for(seed, f"layer{layer_number}.{stream}fc2"))

    def forward(self, x):
        y, bias = self.fc1(x)  # [s, b, fc1_factor*ffn/t]
        return self.fc2(self.act(y, bias, self.sel))
