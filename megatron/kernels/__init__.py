"""Fused kernels with pure-torch references. The model calls the functions in ops; each picks
the fused path or the reference according to kernels.mode (auto | fused | torch)."""
from megatron.kernels.ops import (KernelSelection, bias_gelu, layer_norm, rms_norm, rotary,
                                  scaled_causal_softmax, scaled_masked_softmax, swiglu)

__all__ = ["KernelSelection", "bias_gelu", "layer_norm", "rms_norm", "rotary",
           "scaled_causal_softmax", "scaled_masked_softmax", "swiglu"]
