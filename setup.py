"""Ahead-of-time builds. Importing the package or starting a run never invokes a compiler.

- Data helpers (C++, pybind11): always built, on every platform.
- Fused GPU kernels: built for the architectures named at install time (ROCm:
  PYTORCH_ROCM_ARCH, default gfx90a; CUDA: TORCH_CUDA_ARCH_LIST), only with a GPU build of torch.
"""
import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tools"))


def data_extensions():
    src = os.path.join("csrc", "data", "helpers.cpp")
    if not os.path.exists(src):
        return []
    from pybind11.setup_helpers import Pybind11Extension
    return [Pybind11Extension("megatron.data._helpers", [src], cxx_std=17,
                              extra_compile_args=["-O3"])]


def kernel_extensions():
    try:
        from kernel_build import kernel_extensions as build
    except ImportError:
        return [], {}
    return build()


def main():
    kernels, cmdclass = kernel_extensions()
    setup(ext_modules=data_extensions() + kernels, cmdclass=cmdclass)


main()
