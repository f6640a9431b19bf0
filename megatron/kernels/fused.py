"""The fused side of the ops: the contract every kernel shares, and each op's fused callable
by name.

The autograd Functions live beside their references in builtin/<family>.py. Each takes the
same arguments as its reference and returns the same dtype and shape. A call goes to a kernel
only when `accepts` says it fits (GPU tensors of fp32/fp16/bf16, the shapes the op's record
allows); ops.dispatch sends every other call to the reference, so a fused selection never
changes what a caller may pass.

Weight and bias gradients are summed in fp32 and cast to the parameter's dtype, as autograd
does for the reference."""
from __future__ import annotations

from typing import Optional

import torch

from megatron.kernels import registry

FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def gpu_floats(*tensors: Optional[torch.Tensor]) -> bool:
    return all(t is None or (t.is_cuda and t.dtype in FLOATS) for t in tensors)


def broadcasts(small, big) -> bool:
    return all(a in (1, b) for a, b in zip(reversed(small), reversed(big)))


def fits(op: registry.FusedOp, *args) -> bool:
    """Whether this call of the record `op` (args as its reference takes them) can run fused."""
    if op.fused is None:
        return False
    if args and isinstance(args[0], torch.Tensor) and args[0].numel() == 0:
        return False  # nothing to launch; the reference returns the right empty tensor
    return bool(op.accepts(*args))


def accepts(op: str, *args) -> bool:
    """Whether this call of `op` (args as in its reference) fits the fused kernel."""
    return fits(registry.get(op), *args)


def __getattr__(name: str):
    # fused.rms_norm(...) is the record's fused callable: tests and benchmarks compare it with
    # reference.rms_norm(...) by name, without knowing which builtin/ file defines it.
    try:
        op = registry.get(name)
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    if op.fused is None:
        raise AttributeError(f"{name} is reference-only: no extension module provides it")
    return op.fused
