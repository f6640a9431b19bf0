"""The pure-PyTorch reference of every registered op, by name: reference.rms_norm is the
reference of the record named rms_norm. Math in fp32, result in the input dtype.

Each reference is defined beside its kernel's autograd Function (builtin/<family>.py); tests,
the kernel simulator and the benchmarks name them here, without knowing which file that is."""
from __future__ import annotations

from megatron.kernels import registry


def __getattr__(name: str):
    try:
        return registry.get(name).reference
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
