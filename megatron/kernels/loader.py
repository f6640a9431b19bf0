"""Finds the ahead-of-time kernel build and decides, per op, whether it can run here.

The build (tools/kernel_build.py) writes _build_info.json beside this file: the torch it was
compiled against, the HIP/CUDA version, the target architectures and the ops of each extension
module. Nothing here compiles anything: a missing or mismatched build is reported with the
reason and the fix, and the caller (ops.KernelSelection) raises or falls back."""
from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import torch

from megatron.kernels import registry
from megatron.launch.device import gpu_arch, torch_toolkit

BUILD_INFO_PATH = Path(__file__).with_name("_build_info.json")
PACKAGE = "megatron.kernels"


REBUILD = ("rebuild with `pip install --no-build-isolation -e .` (set PYTORCH_ROCM_ARCH or "
           "TORCH_CUDA_ARCH_LIST to this GPU's architecture)")


@dataclass(frozen=True)
class BuildInfo:
    vendor: str
    torch: str
    toolkit: Optional[str]
    archs: List[str]
    modules: Dict[str, List[str]] = field(default_factory=dict)
    ptx: bool = False
    built_at: str = ""

    @classmethod
    def from_json(cls, data: dict) -> "BuildInfo":
        return cls(vendor=data["vendor"], torch=data["torch"], toolkit=data.get("toolkit"),
                   archs=list(data["archs"]), modules=dict(data.get("modules", {})),
                   ptx=bool(data.get("ptx", False)), built_at=data.get("built_at", ""))

    def ops(self) -> List[str]:
        return [op for ops in self.modules.values() for op in ops]


def load_build_info(path: Optional[Path] = None) -> Optional[BuildInfo]:
    """The recorded build, or None when no kernels were built (a CPU install, say)."""
    path = path or BUILD_INFO_PATH
    try:
        return BuildInfo.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"{path} is unreadable ({exc}); {REBUILD}") from exc


def arch_runs(built: str, gpu: str) -> bool:
    """Whether code built for `built` runs on a GPU of architecture `gpu`, without JIT.

    AMD code objects run only on the exact gfx target (feature suffixes such as :xnack- are
    build variants of the same target). NVIDIA SASS for sm_XY runs on sm_XZ with Z >= Y of the
    same major; the 'a' variants (sm_90a) run only on that exact architecture."""
    if built.startswith("gfx") or gpu.startswith("gfx"):
        return built.split(":")[0] == gpu.split(":")[0]
    b = re.fullmatch(r"sm_(\d+?)(\d)([af]?)", built)
    g = re.fullmatch(r"sm_(\d+?)(\d)([af]?)", gpu)
    if not b or not g:
        return False
    if b.group(3):
        return b.group(1, 2) == g.group(1, 2)
    return b.group(1) == g.group(1) and int(b.group(2)) <= int(g.group(2))


def build_mismatch(info: BuildInfo, arch: Optional[str]) -> Optional[str]:
    """Why this build cannot run with this torch on this GPU, or None when it can."""
    vendor, toolkit = torch_toolkit()
    if vendor != info.vendor:
        return (f"the kernels were built for {info.vendor} but this torch is a {vendor} build "
                f"({torch.__version__}); {REBUILD}")
    if info.torch != torch.__version__ or info.toolkit != toolkit:
        return (f"the kernels were built with torch {info.torch} ({info.vendor} {info.toolkit}) "
                f"but this is torch {torch.__version__} ({vendor} {toolkit}); {REBUILD}")
    if arch is None:
        return "no GPU is visible to torch"
    if not any(arch_runs(built, arch) for built in info.archs):
        return (f"the kernels were built for {', '.join(info.archs)} but this GPU is {arch}; "
                f"{REBUILD}")
    return None


_MODULE_CACHE: Dict[str, object] = {}


def load_module(name: str):
    """Imports one extension module once; ImportError says why (missing, ABI mismatch)."""
    if name not in _MODULE_CACHE:
        _MODULE_CACHE[name] = importlib.import_module(f"{PACKAGE}.{name}")
    return _MODULE_CACHE[name]


def unavailable_reason(op: str, device: torch.device,
                       info: Optional[BuildInfo] = None) -> Optional[str]:
    """None when the fused `op` can run on `device`, else the reason and the fix."""
    module = registry.get(op).module  # KeyError names the known ops
    if device.type != "cuda":
        return f"fused kernels run on GPUs only; this device is the {device.type.upper()}"
    if module is None:
        return (f"{op} has no compiled kernel: no extension module in "
                f"megatron/kernels/catalog.py provides it, so only its torch reference runs")
    info = info if info is not None else load_build_info()
    if info is None:
        return f"no fused kernel build is installed (megatron-kernels shows it); {REBUILD}"
    if op not in info.ops():
        return f"this build has no fused {op}; {REBUILD}"
    mismatch = build_mismatch(info, gpu_arch(device.index or 0))
    if mismatch:
        return mismatch
    try:
        load_module(module)
    except ImportError as exc:
        return f"{PACKAGE}.{module} does not import ({exc}); {REBUILD}"
    return None


def is_available(op: Optional[str] = None, device: Optional[torch.device] = None) -> bool:
    """Whether `op` (every op when None) can run fused on `device` (the current GPU)."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
    ops = [op] if op else registry.names()
    return all(unavailable_reason(name, device) is None for name in ops)
