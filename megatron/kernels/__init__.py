"""Fused kernels with pure-torch references. The model calls the functions in ops; each picks
the fused path or the reference according to kernels.mode (auto | fused | torch). The kernels
are compiled ahead of time (tools/kernel_build.py); loader checks the build against this GPU
and torch, and `megatron-kernels` reports it."""
from megatron.kernels.loader import is_available, load_build_info, unavailable_reason
from megatron.kernels.ops import (KernelSelection, bias_gelu, layer_norm, rms_norm, rotary,
                                  scaled_causal_softmax, scaled_masked_softmax, swiglu)

__all__ = ["KernelSelection", "bias_gelu", "is_available", "layer_norm", "load_build_info",
           "rms_norm", "rotary", "scaled_causal_softmax", "scaled_masked_softmax", "swiglu",
           "unavailable_reason"]
