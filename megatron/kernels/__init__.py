"""Fused kernels with pure-torch references. Each op is a record (registry.FusedOp: reference,
fused autograd Function, the calls its kernel accepts, its extension module); the built-in ones
are defined and registered in builtin/, one file per extension module. The model calls the
wrappers in ops, which go through the one dispatch: fused or reference according to
kernels.mode (auto | fused | torch). The kernels are compiled ahead of time
(tools/kernel_build.py, from catalog.py); loader checks the build against this GPU and torch,
and `megatron-kernels` reports it."""
from megatron.kernels import builtin  # noqa: F401 (registers the built-in ops)
from megatron.kernels.loader import is_available, load_build_info, unavailable_reason
from megatron.kernels.ops import (KernelSelection, bias_gelu, dispatch, layer_norm, rms_norm,
                                  rotary, scaled_causal_softmax, scaled_masked_softmax, swiglu)
from megatron.kernels.registry import FusedOp, register

__all__ = ["FusedOp", "KernelSelection", "bias_gelu", "dispatch", "is_available", "layer_norm",
           "load_build_info", "register", "rms_norm", "rotary", "scaled_causal_softmax",
           "scaled_masked_softmax", "swiglu", "unavailable_reason"]
