"""Dispatch between fused kernels and the torch references, through the ops' records.

KernelSelection is built once at startup from kernels.mode and the device; `fused` that cannot
run raises there, `auto` falls back with one log line per reason. `dispatch` is the one path
from a call to a kernel: a selected op whose record accepts the call runs fused, every other
call (CPU tensors, float64, undocumented shapes; see fused.fits) runs the record's torch path,
so selection never changes what a caller may pass. The named functions below are the wrappers
the model calls; their signatures are the model's contract."""
from __future__ import annotations

import logging
from typing import Dict, Optional

import torch

from megatron.config.errors import ConfigError
from megatron.kernels import fused, registry
# The ops' records (each op's name is its record's); the norms' and activations' torch paths
# on a GPU (torch's kernels in the inputs' dtype)
from megatron.kernels.builtin.activation import BIAS_GELU, SWIGLU
from megatron.kernels.builtin.activation import native_activation  # noqa: F401
from megatron.kernels.builtin.norm import LAYER_NORM, RMS_NORM
from megatron.kernels.builtin.norm import native_norm  # noqa: F401
from megatron.kernels.builtin.rotary import ROTARY
from megatron.kernels.builtin.softmax import SCALED_CAUSAL_SOFTMAX, SCALED_MASKED_SOFTMAX
from megatron.kernels.loader import unavailable_reason

log = logging.getLogger(__name__)


def fused_available(op: str, device: torch.device) -> Optional[str]:
    """None when the fused op can run on `device`, else the reason it cannot."""
    return unavailable_reason(op, device)


class KernelSelection:
    def __init__(self, mode: str = "torch", device: torch.device = torch.device("cpu")):
        self.mode = mode
        self.device = device
        self.use_fused: Dict[str, bool] = {}
        self.reasons: Dict[str, str] = {}
        for op in registry.names():
            if mode == "torch":
                self.use_fused[op] = False
                continue
            reason = fused_available(op, device)
            if reason and mode == "fused":
                raise ConfigError("kernels.mode", mode, f"a mode this device can run: fused "
                                  f"{op} is unavailable ({reason})", "use kernels.mode=auto or torch")
            if reason:
                self.reasons[op] = reason
            self.use_fused[op] = reason is None
        self._log_fallbacks()

    def _log_fallbacks(self) -> None:
        # Once per distinct reason: on a CPU every op falls back for the same one.
        by_reason: Dict[str, list] = {}
        for op, reason in self.reasons.items():
            by_reason.setdefault(reason, []).append(op)
        for reason, ops in by_reason.items():
            log.info("kernels: %s use%s the torch reference (%s)", ", ".join(ops),
                     "s" if len(ops) == 1 else "", reason)


def dispatch(name: str, sel: KernelSelection, *args):
    """Op `name` on `args` (as its reference takes them): fused when `sel` selected it (its
    extension loaded) and its record accepts the call, else its torch path."""
    op = registry.get(name)
    if sel.use_fused.get(name, False) and fused.fits(op, *args):
        return op.fused(*args)
    return (op.unfused or op.reference)(*args)


# The default of the wrappers: torch references, for callers without a model context (tests,
# tools); the model always passes its own selection.
_DEFAULT = KernelSelection()


def layer_norm(x, weight, bias, eps, sel: KernelSelection = _DEFAULT):
    return dispatch(LAYER_NORM.name, sel, x, weight, bias, eps)


def rms_norm(x, weight, eps, sel: KernelSelection = _DEFAULT):
    return dispatch(RMS_NORM.name, sel, x, weight, eps)


def scaled_masked_softmax(scores, mask, scale, sel: KernelSelection = _DEFAULT):
    return dispatch(SCALED_MASKED_SOFTMAX.name, sel, scores, mask, scale)


def scaled_causal_softmax(scores, scale, sel: KernelSelection = _DEFAULT):
    return dispatch(SCALED_CAUSAL_SOFTMAX.name, sel, scores, scale)


def rotary(x, cos, sin, sel: KernelSelection = _DEFAULT):
    return dispatch(ROTARY.name, sel, x, cos, sin)


def bias_gelu(x, bias, sel: KernelSelection = _DEFAULT):
    return dispatch(BIAS_GELU.name, sel, x, bias)


def swiglu(gate, up, sel: KernelSelection = _DEFAULT):
    return dispatch(SWIGLU.name, sel, gate, up)
