"""Ahead-of-time build of the fused GPU kernels; setup.py calls kernel_extensions().

- ROCm torch: tools/hipify_build.py converts csrc/ into build/hip, then one CUDAExtension per op
  family is compiled by hipcc for PYTORCH_ROCM_ARCH (default gfx90a = MI250X; gfx942 = MI300X).
- CUDA torch: the same extensions from csrc/ for TORCH_CUDA_ARCH_LIST (default "8.0;9.0").
- CPU torch: no kernel extensions ([], {}); the C++ data helper is built by setup.py itself.

MAX_JOBS bounds parallel compilation (ninja reads it; without ninja it sets build_ext -j). The
build writes megatron/kernels/_build_info.json (torch, HIP/CUDA version, architectures, ops),
which megatron.kernels checks at load time against the running GPU and torch.
"""
from __future__ import annotations

import json
import os
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Mapping, Tuple

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "megatron.kernels"
BUILD_INFO = "_build_info.json"
DEFAULT_ROCM_ARCH = "gfx90a"
DEFAULT_CUDA_ARCH = "8.0;9.0"



def _catalog() -> dict:
    """megatron/kernels/catalog.py, the one table of extension modules, sources and ops, loaded
    by path: importing the megatron package from its own build would need torch and more."""
    namespace: dict = {}
    path = ROOT / "megatron" / "kernels" / "catalog.py"
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace["MODULES"]


# Extension module -> its two translation units (relative to csrc/) and the ops it provides.
MODULES: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...]]] = _catalog()


class KernelBuildError(ValueError):
    """A build setting is wrong; the message names the variable, the value and the fix."""


def rocm_archs(env: Mapping[str, str]) -> List[str]:
    raw = env.get("PYTORCH_ROCM_ARCH") or DEFAULT_ROCM_ARCH
    archs = [a for a in re.split(r"[;\s,]+", raw) if a]
    for arch in archs:
        # The kernels assume 64-lane wavefronts: CDNA (gfx9xx). RDNA (gfx10+) runs 32 lanes.
        if not re.fullmatch(r"gfx9[0-9a-f]+(:[a-z+-]+)*", arch):
            raise KernelBuildError(
                f"PYTORCH_ROCM_ARCH={raw!r}: {arch!r} is not a CDNA target; expected e.g. "
                f"gfx90a (MI250X) or gfx942 (MI300X), separated by ';'")
    return archs


def cuda_archs(env: Mapping[str, str]) -> Tuple[List[str], bool]:
    """('8.0;9.0+PTX') -> (['sm_80', 'sm_90'], True). PTX is only embedded when asked for: the
    driver would JIT-compile it on a newer GPU, and this project compiles ahead of time."""
    raw = env.get("TORCH_CUDA_ARCH_LIST") or DEFAULT_CUDA_ARCH
    archs, ptx = [], False
    for item in (a for a in re.split(r"[;\s,]+", raw) if a):
        match = re.fullmatch(r"(\d+)\.(\d+)([af]?)(\+PTX)?", item)
        if not match:
            raise KernelBuildError(f"TORCH_CUDA_ARCH_LIST={raw!r}: cannot read {item!r}; expected "
                                   f"compute capabilities like '8.0;9.0' (A100, H100/H200)")
        if int(match.group(1)) < 7:
            raise KernelBuildError(f"TORCH_CUDA_ARCH_LIST={raw!r}: {item} predates bf16 support "
                                   f"in these kernels; use 7.0 or newer (8.0 recommended)")
        archs.append(f"sm_{match.group(1)}{match.group(2)}{match.group(3)}")
        ptx = ptx or bool(match.group(4))
    return archs, ptx


def arch_flags(vendor: str, archs: List[str], ptx: bool) -> List[str]:
    if vendor == "rocm":
        return [f"--offload-arch={a}" for a in archs]
    flags = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in archs]
    if ptx:
        flags.append(f"-gencode=arch=compute_{archs[-1][3:]},code=compute_{archs[-1][3:]}")
    return flags


def check_cuda_home(cuda_home) -> None:
    """torch guesses CUDA_HOME from `which nvcc` (two folders up); a wrapper script on PATH makes
    that guess a folder without the toolkit's headers, and nvcc then fails deep in the build."""
    hint = "set CUDA_HOME to the toolkit root, the folder holding bin/nvcc and include/"
    if not cuda_home:
        raise KernelBuildError(f"CUDA_HOME is not set and no nvcc is on PATH; the fused kernels "
                               f"need the CUDA toolkit to build against a CUDA torch: {hint}")
    if not (Path(cuda_home) / "include" / "cuda_runtime.h").exists():
        raise KernelBuildError(f"CUDA_HOME={cuda_home!r} has no include/cuda_runtime.h, so it is "
                               f"not a CUDA toolkit root: {hint} (e.g. CUDA_HOME=/usr/local/cuda)")


def pip_cuda_includes(cuda_home: str, site_dirs: List[str]) -> List[str]:
    """Header folders of pip's NVIDIA wheels, when the toolkit at CUDA_HOME lacks the library
    headers that torch's CUDA headers include (cusparse.h, cublas_v2.h): an nvcc-only toolkit
    beside a torch whose CUDA libraries came from PyPI. Empty when the toolkit is complete."""
    if (Path(cuda_home) / "include" / "cusparse.h").exists():
        return []
    found = []
    for site in site_dirs:
        for inc in sorted(Path(site).glob("nvidia/*/include")):
            if (inc / "cusparse.h").exists() or (inc / "cublas_v2.h").exists():
                found.append(str(inc))
    return found


def build_info(vendor: str, archs: List[str], ptx: bool) -> dict:
    import torch
    return {
        "schema": 1,
        "vendor": vendor,
        "torch": torch.__version__,
        "toolkit": torch.version.hip if vendor == "rocm" else torch.version.cuda,
        "archs": archs,
        "ptx": ptx,
        "modules": {name: list(ops) for name, (_, ops) in MODULES.items()},
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _sources(vendor: str) -> Dict[str, List[str]]:
    if vendor == "cuda":
        return {name: [f"csrc/{s}" for s in srcs] for name, (srcs, _) in MODULES.items()}
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hipify_build import hipify_tree
    result = hipify_tree(ROOT / "build" / "hip")
    return {name: [os.path.relpath(result.path(s), ROOT) for s in srcs]
            for name, (srcs, _) in MODULES.items()}


def _build_ext_class(info: dict):
    from torch.utils.cpp_extension import BuildExtension

    class BuildKernels(BuildExtension):
        """torch's BuildExtension, plus MAX_JOBS without ninja and the build-info record."""

        def finalize_options(self):
            super().finalize_options()
            # With ninja, MAX_JOBS bounds ninja's own jobs. Extensions must then be built one
            # after another: torch writes every extension's build.ninja to the same temp folder.
            from torch.utils.cpp_extension import is_ninja_available
            jobs = os.environ.get("MAX_JOBS", "")
            ninja = self.use_ninja and is_ninja_available()
            if jobs.isascii() and jobs.isdigit() and not self.parallel and not ninja:
                self.parallel = int(jobs)

        def run(self):
            super().run()
            text = json.dumps(info, indent=1, sort_keys=True) + "\n"
            targets = [Path(self.build_lib) / "megatron" / "kernels"]
            if self.inplace:
                targets.append(ROOT / "megatron" / "kernels")
            for folder in targets:
                folder.mkdir(parents=True, exist_ok=True)
                (folder / BUILD_INFO).write_text(text)

    return BuildKernels


def kernel_extensions(env: Mapping[str, str] = os.environ):
    """(extensions, cmdclass) for setup(); ([], {}) with a CPU build of torch."""
    try:
        import torch
    except ImportError:
        # pip's isolated build environment has no torch: the kernels must be compiled against
        # the torch that will run them, which is what --no-build-isolation provides.
        print("kernel_build: torch is not importable here; no fused kernels are built "
              "(install with --no-build-isolation)")
        return [], {}
    if torch.version.hip:
        vendor, (archs, ptx) = "rocm", (rocm_archs(env), False)
    elif torch.version.cuda:
        vendor, (archs, ptx) = "cuda", cuda_archs(env)
    else:
        return [], {}
    from torch.utils.cpp_extension import CUDA_HOME, CUDAExtension
    flags = arch_flags(vendor, archs, ptx)
    print(f"kernel_build: {vendor} {torch.version.hip or torch.version.cuda}, torch "
          f"{torch.__version__}, targets {' '.join(archs)}")
    includes = []
    if vendor == "cuda":
        import site
        check_cuda_home(CUDA_HOME)
        includes = pip_cuda_includes(CUDA_HOME, site.getsitepackages())
        if includes:
            print(f"kernel_build: {CUDA_HOME}/include has no cusparse.h; adding the headers of "
                  f"pip's NVIDIA wheels: {' '.join(includes)}")
    extensions = [
        CUDAExtension(name=f"{PACKAGE}.{name}", sources=sources, include_dirs=list(includes),
                      extra_compile_args={"cxx": ["-O3", "-g0"],
                                          "nvcc": ["-O3"] + flags})
        for name, sources in _sources(vendor).items()
    ]
    return extensions, {"build_ext": _build_ext_class(build_info(vendor, archs, ptx))}
