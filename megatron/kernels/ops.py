"""Dispatch between fused kernels and the torch references.

KernelSelection is built once at startup from kernels.mode and the device; `fused` that cannot
run raises there, `auto` falls back with one log line per op. Until fused kernels are built for
this device every op uses its reference."""
from __future__ import annotations

import logging
from typing import Dict, Optional

import torch

from megatron.config.errors import ConfigError
from megatron.kernels import reference

log = logging.getLogger(__name__)

OPS = ("layer_norm", "rms_norm", "scaled_masked_softmax", "scaled_causal_softmax", "rotary",
       "bias_gelu", "swiglu")


def fused_available(op: str, device: torch.device) -> Optional[str]:
    """None when the fused op can run on `device`, else the reason it cannot."""
    if device.type != "cuda":
        return "fused kernels run on GPUs only; this device is the CPU"
    return "no fused kernel build is installed (see megatron-kernels)"


class KernelSelection:
    def __init__(self, mode: str = "torch", device: torch.device = torch.device("cpu")):
        self.mode = mode
        self.use_fused: Dict[str, bool] = {}
        for op in OPS:
            if mode == "torch":
                self.use_fused[op] = False
                continue
            reason = fused_available(op, device)
            if reason and mode == "fused":
                raise ConfigError("kernels.mode", mode, f"a mode this device can run: fused "
                                  f"{op} is unavailable ({reason})", "use kernels.mode=auto or torch")
            if reason:
                log.info("kernels: %s uses the torch reference (%s)", op, reason)
            self.use_fused[op] = reason is None


_DEFAULT = KernelSelection()


def layer_norm(x, weight, bias, eps, sel: KernelSelection = _DEFAULT):
    return reference.layer_norm(x, weight, bias, eps)


def rms_norm(x, weight, eps, sel: KernelSelection = _DEFAULT):
    return reference.rms_norm(x, weight, eps)


def scaled_masked_softmax(scores, mask, scale, sel: KernelSelection = _DEFAULT):
    return reference.scaled_masked_softmax(scores, mask, scale)


def scaled_causal_softmax(scores, scale, sel: KernelSelection = _DEFAULT):
    return reference.scaled_causal_softmax(scores, scale)


def rotary(x, cos, sin, sel: KernelSelection = _DEFAULT):
    return reference.rotary(x, cos, sin)


def bias_gelu(x, bias, sel: KernelSelection = _DEFAULT):
    return reference.bias_gelu(x, bias)


def swiglu(gate, up, sel: KernelSelection = _DEFAULT):
    return reference.swiglu(gate, up)
