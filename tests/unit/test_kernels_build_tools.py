"""tools/hipify_build.py and tools/kernel_build.py without compiling: the HIP tree is complete
and free of CUDA-only names, the sources stay untouched, survivors fail the build, device code
names no 32-lane literal, and the build settings parse (and reject) architectures clearly."""
from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

import pytest
import torch

from tests.support.paths import ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))
import hipify_build  # noqa: E402
import kernel_build  # noqa: E402

CSRC = Path(ROOT, "csrc")


def digest(tree: Path) -> dict:
    return {str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(tree.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def hip_tree(tmp_path_factory):
    before = digest(CSRC)
    lines = []
    result = hipify_build.hipify_tree(tmp_path_factory.mktemp("hip") / "hip", log=lines.append)
    assert digest(CSRC) == before, "hipify must not modify csrc/"
    return result, lines


def test_tree_has_every_unit_and_binding_and_only_hip(hip_tree):
    result, lines = hip_tree
    for module, (sources, _) in kernel_build.MODULES.items():
        for source in sources:
            assert result.path(source).exists(), f"{module}: {source} has no hipified file"
    assert result.converted["kernels/instantiate/softmax.cu"].endswith(".hip")
    assert not list(result.out.rglob("*.cu")), "CUDA copies must be removed from the HIP tree"
    assert (result.out / "manifest.json").exists()
    assert any("compat.cuh" in line and "replaced" in line for line in lines), lines


def test_compat_header_is_the_hip_one(hip_tree):
    result, _ = hip_tree
    text = result.path("kernels/compat.cuh").read_text()
    assert text == (CSRC / "hip" / "compat_hip.h").read_text()
    assert "#define MF_WARP_SIZE 64" in text and "struct alignas(2) bf16_t" in text


def test_survivors_fail_the_build(tmp_path):
    fake = tmp_path / "csrc"
    for tree in hipify_build.TREES:
        (fake / tree).mkdir(parents=True)
    (fake / "hip").mkdir()
    (fake / "hip" / "compat_hip.h").write_text("#pragma once\n")
    (fake / "kernels" / "compat.cuh").write_text("#pragma once\n#include <cuda_runtime.h>\n")
    (fake / "kernels" / "bad.cuh").write_text(
        '#include "compat.cuh"\n// __shfl_xor_sync in a comment is fine\n'
        "__device__ float f(float v) { return __shfl_xor_sync(0xffffffff, v, 1); }\n")
    with pytest.raises(hipify_build.HipifyError) as err:
        hipify_build.hipify_tree(tmp_path / "out", csrc=fake, log=lambda line: None)
    message = str(err.value)
    # The line is the hipified file's (hipify adds a marker line on top); the source is named.
    assert "kernels/bad_hip.cuh:4: __shfl_xor_sync" in message, message
    assert "[from csrc/kernels/bad.cuh]" in message, message
    assert ":3:" not in message, "comments must not count"


def test_device_code_names_no_lane_literals_or_raw_shuffles():
    # Lane masks and shuffles live only in the compat headers: a 32-lane mask or a raw
    # __shfl in a kernel is wrong on 64-lane CDNA wavefronts.
    for path in sorted((CSRC / "kernels").rglob("*")):
        if path.suffix not in (".cuh", ".cu", ".h") or path.name == "compat.cuh":
            continue
        code = re.sub(r"//[^\n]*", "", path.read_text())
        assert "0xffffffff" not in code.lower(), f"{path.name}: 32-lane mask literal"
        assert "__shfl" not in code, f"{path.name}: raw shuffle; use mf::shfl_xor"
        assert "warpSize" not in code, f"{path.name}: use mf::kWarpSize (compile-time)"
        assert "torch" not in code and "ATen" not in code, f"{path.name}: device code is torch-free"


@pytest.mark.skipif(bool(torch.version.cuda or torch.version.hip), reason="a GPU torch builds them")
def test_cpu_torch_builds_no_kernel_extensions():
    assert kernel_build.kernel_extensions() == ([], {})


def test_architecture_settings():
    assert kernel_build.rocm_archs({}) == ["gfx90a"]
    assert kernel_build.rocm_archs({"PYTORCH_ROCM_ARCH": "gfx90a;gfx942"}) == ["gfx90a", "gfx942"]
    with pytest.raises(kernel_build.KernelBuildError, match="gfx1100.*not a CDNA target"):
        kernel_build.rocm_archs({"PYTORCH_ROCM_ARCH": "gfx1100"})
    assert kernel_build.cuda_archs({}) == (["sm_80", "sm_90"], False)
    assert kernel_build.cuda_archs({"TORCH_CUDA_ARCH_LIST": "8.0 9.0a+PTX"}) == \
        (["sm_80", "sm_90a"], True)
    with pytest.raises(kernel_build.KernelBuildError, match="TORCH_CUDA_ARCH_LIST"):
        kernel_build.cuda_archs({"TORCH_CUDA_ARCH_LIST": "Hopper"})
    assert kernel_build.arch_flags("rocm", ["gfx90a", "gfx942"], False) == \
        ["--offload-arch=gfx90a", "--offload-arch=gfx942"]
    assert kernel_build.arch_flags("cuda", ["sm_80", "sm_90"], True) == [
        "-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90"]


def test_cuda_home_must_be_a_toolkit_root(tmp_path):
    with pytest.raises(kernel_build.KernelBuildError, match="CUDA_HOME is not set"):
        kernel_build.check_cuda_home(None)
    with pytest.raises(kernel_build.KernelBuildError,
                       match=r"has no include/cuda_runtime.h.*set CUDA_HOME to the toolkit root"):
        kernel_build.check_cuda_home(str(tmp_path))
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "cuda_runtime.h").write_text("")
    kernel_build.check_cuda_home(str(tmp_path))


def test_pip_cuda_headers_are_added_only_when_the_toolkit_lacks_them(tmp_path):
    """An nvcc-only toolkit beside a torch whose CUDA libraries came from PyPI: torch's headers
    include cusparse.h, which only pip's nvidia/*/include folders then provide."""
    toolkit, site = tmp_path / "cuda", tmp_path / "site"
    (toolkit / "include").mkdir(parents=True)
    for pkg, header in (("cu13", "cusparse.h"), ("cudnn", "cudnn.h"), ("nccl", "nccl.h")):
        (site / "nvidia" / pkg / "include").mkdir(parents=True)
        (site / "nvidia" / pkg / "include" / header).write_text("")
    found = kernel_build.pip_cuda_includes(str(toolkit), [str(site), str(tmp_path / "absent")])
    assert found == [str(site / "nvidia" / "cu13" / "include")]
    (toolkit / "include" / "cusparse.h").write_text("")
    assert kernel_build.pip_cuda_includes(str(toolkit), [str(site)]) == []


@pytest.mark.parametrize("ninja", [True, False])
def test_max_jobs_never_builds_extensions_in_parallel_under_ninja(monkeypatch, ninja):
    """With ninja, MAX_JOBS bounds ninja's jobs; building extensions in parallel as well would
    have them overwrite each other's build.ninja in the shared temp folder (seen with a real CUDA
    build). Without ninja, MAX_JOBS becomes build_ext's -j."""
    from setuptools import Distribution
    from torch.utils import cpp_extension
    monkeypatch.setenv("MAX_JOBS", "3")
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: ninja)
    cmd = kernel_build._build_ext_class({})(Distribution({"name": "x"}))
    cmd.ensure_finalized()
    assert cmd.parallel == (None if ninja else 3)


def test_out_is_deleted_only_where_this_tool_made_it(tmp_path, capsys):
    """Each run deletes and recreates --out: `--out .` deleted the checkout, a file or a missing
    --csrc were tracebacks (after the deletion). Now a folder holding anything this tool did not
    write, a file, an ancestor of csrc/ and a csrc without its trees are refused, exit 2, before
    anything is touched."""
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("keep me\n")
    (tmp_path / "afile").write_text("x\n")

    def refused(argv, fragment):
        assert hipify_build.main(argv) == 2
        out, err = capsys.readouterr()
        assert err.startswith("hipify_build: error: ") and fragment in err and out == "", err
    refused(["--out", str(keep)], "holds files this tool did not write")
    refused(["--out", str(tmp_path / "afile")], "is a file: expected a folder")
    refused(["--out", str(ROOT)], f"holds the source tree '{CSRC.resolve()}'")
    refused(["--csrc", str(tmp_path / "none"), "--out", str(tmp_path / "hip")],
            "is not the CUDA source tree")
    assert (keep / "notes.txt").read_text() == "keep me\n"
    assert not (tmp_path / "hip").exists()
    # a tree the tool made is remade, an empty folder is taken
    hipify_build.check_paths(tmp_path / "new", CSRC)
    made = tmp_path / "made"
    made.mkdir()
    hipify_build.check_paths(made, CSRC)
    (made / hipify_build.MARKER).write_text("")
    (made / "kernels").mkdir()
    hipify_build.check_paths(made, CSRC)
