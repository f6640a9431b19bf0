"""The fused-op catalog, in one place: each extension module, the two translation units it is
compiled from (relative to csrc/) and the ops it provides.

Read by megatron.kernels, whose op records (registry.py) take their module and sources from
here and list the ops in this order, and by tools/kernel_build.py at build time, which loads
this file by path: it imports nothing, so the build never imports the package it is building.
An op's run-time half (reference, autograd Function, accepted calls) is its file in builtin/."""

MODULES = {
    "_fused_softmax": (("bindings/softmax.cpp", "kernels/instantiate/softmax.cu"),
                       ("scaled_masked_softmax", "scaled_causal_softmax")),
    "_fused_norm": (("bindings/norm.cpp", "kernels/instantiate/norm.cu"),
                    ("layer_norm", "rms_norm")),
    "_fused_rotary": (("bindings/rotary.cpp", "kernels/instantiate/rotary.cu"), ("rotary",)),
    "_fused_activation": (("bindings/activation.cpp", "kernels/instantiate/activation.cu"),
                          ("bias_gelu", "swiglu")),
}

# Every fused op, in catalog order.
OPS = tuple(op for _, ops in MODULES.values() for op in ops)

# Op -> the extension module that provides it.
MODULE_OF = {op: module for module, (_, ops) in MODULES.items() for op in ops}
