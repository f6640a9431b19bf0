"""What `megatron-kernels` reports: the kernel build, whether each op runs here, and whether the
third-party kernels the attention and optimizer paths can use (apex, flash-attn) are usable.
Plain data; megatron/cli/kernels.py formats it."""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from dataclasses import asdict, dataclass, field
from typing import List, Optional

import torch

from megatron.kernels import loader, registry
from megatron.kernels.loader import (BuildInfo, build_mismatch, load_build_info,
                                     unavailable_reason)
from megatron.launch.device import gpu_arch, torch_toolkit


@dataclass
class OpStatus:
    op: str
    module: Optional[str]  # None: a reference-only op, which no extension module provides
    built: bool
    runs_here: bool
    reason: Optional[str] = None


@dataclass
class ThirdParty:
    name: str
    present: bool
    version: Optional[str] = None
    usable: bool = False
    detail: str = ""


@dataclass
class KernelReport:
    torch_version: str
    toolkit: str
    gpu_name: Optional[str]
    gpu_arch: Optional[str]
    build_info_path: str
    build: Optional[BuildInfo]
    build_mismatch: Optional[str]
    ops: List[OpStatus] = field(default_factory=list)
    third_party: List[ThirdParty] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _probe(name: str, dist: str, top: str, extension: str, gpu: bool) -> ThirdParty:
    """Present when `top` is importable; usable when its compiled `extension` also imports and
    a GPU is visible (both projects ship CUDA/ROCm-only kernels)."""
    if importlib.util.find_spec(top) is None:
        return ThirdParty(name, False, detail="not installed")
    version = _version(dist)
    try:
        importlib.import_module(extension)
    except Exception as exc:  # an ABI mismatch raises ImportError, a bad build anything
        return ThirdParty(name, True, version, False, f"{extension} does not import ({exc})")
    if not gpu:
        return ThirdParty(name, True, version, False, "installed, but no GPU is visible")
    return ThirdParty(name, True, version, True, f"{extension} imports")


def third_party(gpu: bool) -> List[ThirdParty]:
    return [
        # apex's fused LayerNorm/Adam live in separately compiled modules; on ROCm they exist
        # only when apex was rebuilt for ROCm (the Frontier paper had to).
        _probe("apex", "apex", "apex", "fused_layer_norm_cuda", gpu),
        # flash-attn 2 compiles to flash_attn_2_cuda on CUDA and on ROCm (CK backend) alike.
        _probe("flash-attn", "flash_attn", "flash_attn", "flash_attn_2_cuda", gpu),
    ]


def kernel_report(device: Optional[torch.device] = None) -> KernelReport:
    gpu = torch.cuda.is_available()
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    vendor, version = torch_toolkit()
    arch = gpu_arch(device.index or 0) if device.type == "cuda" else None
    info = load_build_info()
    report = KernelReport(
        torch_version=torch.__version__, toolkit=f"{vendor} {version}" if version else vendor,
        gpu_name=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        gpu_arch=arch, build_info_path=str(loader.BUILD_INFO_PATH), build=info,
        build_mismatch=build_mismatch(info, arch) if info else None)
    built = set(info.ops()) if info else set()
    for op in registry.records():
        reason = unavailable_reason(op.name, device, info)
        report.ops.append(OpStatus(op.name, op.module, op.name in built, reason is None, reason))
    report.third_party = third_party(gpu)
    return report
