"""Dispatch between fused kernels and the torch references.

KernelSelection is built once at startup from kernels.mode and the device; `fused` that cannot
run raises there, `auto` falls back with one log line per op. A selected fused op still sends
calls outside its kernel's contract (CPU tensors, float64, undocumented shapes; see
fused.accepts) to the reference, so selection never changes what a caller may pass."""
from __future__ import annotations

import logging
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from megatron.config.errors import ConfigError
from megatron.kernels import fused, reference
from megatron.kernels.catalog import OPS
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
        for op in OPS:
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


_DEFAULT = KernelSelection()


def _fused(sel: KernelSelection, op: str, *args) -> bool:
    return sel.use_fused.get(op, False) and fused.accepts(op, *args)


def native_norm(x, *params) -> bool:
    """Whether a norm that is not fused goes to torch's own kernel instead of the reference.

    On a GPU, with weights in the activations' dtype (bf16/fp16 training keeps norm weights in
    the model dtype), torch's kernels keep fp32 statistics inside without materialising an fp32
    copy of the activations: the fast fallback when no fused build is present. On the CPU the
    reference's explicit upcast is kept: torch's CPU backward in bf16/fp16 loses precision on
    short rows, and CPU runs are the equivalence and test runs."""
    return x.is_cuda and all(p is None or p.dtype == x.dtype for p in params)


def layer_norm(x, weight, bias, eps, sel: KernelSelection = _DEFAULT):
    if _fused(sel, "layer_norm", x, weight, bias):
        return fused.layer_norm(x, weight, bias, eps)
    if native_norm(x, weight, bias):
        return F.layer_norm(x, x.shape[-1:], weight, bias, eps)
    return reference.layer_norm(x, weight, bias, eps)


def rms_norm(x, weight, eps, sel: KernelSelection = _DEFAULT):
    if _fused(sel, "rms_norm", x, weight):
        return fused.rms_norm(x, weight, eps)
    if native_norm(x, weight):
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    return reference.rms_norm(x, weight, eps)


def scaled_masked_softmax(scores, mask, scale, sel: KernelSelection = _DEFAULT):
    if _fused(sel, "scaled_masked_softmax", scores, mask):
        return fused.scaled_masked_softmax(scores, mask, scale)
    return reference.scaled_masked_softmax(scores, mask, scale)


def scaled_causal_softmax(scores, scale, sel: KernelSelection = _DEFAULT):
    if _fused(sel, "scaled_causal_softmax", scores):
        return fused.scaled_causal_softmax(scores, scale)
    return reference.scaled_causal_softmax(scores, scale)


def rotary(x, cos, sin, sel: KernelSelection = _DEFAULT):
    if _fused(sel, "rotary", x, cos, sin):
        return fused.rotary(x, cos, sin)
    return reference.rotary(x, cos, sin)


def bias_gelu(x, bias, sel: KernelSelection = _DEFAULT):
    if _fused(sel, "bias_gelu", x, bias):
        return fused.bias_gelu(x, bias)
    return reference.bias_gelu(x, bias)


def swiglu(gate, up, sel: KernelSelection = _DEFAULT):
    if _fused(sel, "swiglu", gate, up):
        return fused.swiglu(gate, up)
    return reference.swiglu(gate, up)
