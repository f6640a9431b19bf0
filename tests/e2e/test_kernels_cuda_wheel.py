"""The NVIDIA wheel, built for real on this CPU: a CUDA build of torch in a venv of its own,
`pip wheel --no-build-isolation` with TORCH_CUDA_ARCH_LIST="8.0;9.0" and MAX_JOBS=2 (setup.py ->
tools/kernel_build.py -> torch's BuildExtension -> nvcc and g++), then the wheel opened and used:

- it holds the four extension modules and the build record;
- each module's fatbin holds sm_80 and sm_90 cubins defining every kernel instantiation;
- the modules import under the CUDA torch (every symbol resolves against libtorch_cuda/cudart);
- `megatron-kernels` reports the build there, and under the CPU torch reports the mismatch.

Nothing can launch without a GPU; tests/gpu runs the kernels where one is present. The CUDA torch
(several GB) installs from pip's local wheel cache on the development machine, in about two
minutes; the build takes about one and a half (docs/kernels.md). MEGATRON_SKIP_CUDA_WHEEL=1
skips it for quick local runs."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.support.codeobjects import EXPECTED_KERNELS, check_kernels, cuda_cubins, defined_kernels
from tests.support.paths import ROOT

NVCC = shutil.which("nvcc")
CUDA_TORCH = os.environ.get("MEGATRON_CUDA_TORCH", "torch==2.14.1")
ARCHS = ("sm_80", "sm_90")
MODULES = {  # extension module -> (kernel unit, functions its binding exports)
    "_fused_softmax": ("softmax", {"masked_forward", "masked_backward", "causal_forward",
                                   "causal_backward"}),
    "_fused_norm": ("norm", {"forward", "backward"}),
    "_fused_rotary": ("rotary", {"forward", "backward"}),
    "_fused_activation": ("activation", {"bias_gelu_forward", "bias_gelu_backward",
                                         "swiglu_forward", "swiglu_backward"}),
}

pytestmark = [
    pytest.mark.skipif(NVCC is None, reason="nvcc is not installed"),
    pytest.mark.skipif(os.environ.get("MEGATRON_SKIP_CUDA_WHEEL") == "1",
                       reason="MEGATRON_SKIP_CUDA_WHEEL=1"),
]


def _run(cmd, timeout, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-5000:]}"
    return proc


def _cuda_home() -> str:
    # /usr/local/bin/nvcc may be a wrapper script: ask nvcc where its toolkit is.
    home = Path(os.path.realpath(NVCC)).parent.parent
    if not (home / "include" / "cuda_runtime.h").exists() and Path("/usr/local/cuda").exists():
        home = Path("/usr/local/cuda")
    return str(home)


@pytest.fixture(scope="module")
def cuda_venv():
    """A venv with the CUDA torch; kept under build/ so local reruns skip the install."""
    venv = Path(ROOT, "build", "cuda-torch-venv")
    py = venv / "bin" / "python"
    probe = "import torch, sys; sys.exit(0 if torch.version.cuda else 1)"
    if not py.exists() or subprocess.run([str(py), "-c", probe]).returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(venv)], 120)
        begin = time.monotonic()
        # --no-compile: no bytecode for the thousands of modules this venv never imports (the
        # build and the import checks load a few; Python compiles those when it does)
        _run([str(py), "-m", "pip", "install", "-q", "--no-compile", CUDA_TORCH, "numpy",
              "pyyaml", "pybind11", "sentencepiece", "setuptools", "wheel"], 1800)
        print(f"\nCUDA torch venv: {time.monotonic() - begin:.0f}s to install {CUDA_TORCH}")
    return py


@pytest.fixture(scope="module")
def wheel(cuda_venv, tmp_path_factory):
    """Builds the wheel from a copy of the tree (the checkout's own build/ stays untouched)."""
    work = tmp_path_factory.mktemp("cuda_wheel")
    files = _run(["git", "ls-files", "-co", "--exclude-standard"], 60, cwd=ROOT).stdout.split()
    src = work / "src"
    for name in files:
        if Path(ROOT, name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(ROOT, name), src / name)
    env = dict(os.environ, CUDA_HOME=_cuda_home(), TORCH_CUDA_ARCH_LIST="8.0;9.0", MAX_JOBS="2")
    begin = time.monotonic()
    proc = _run([str(cuda_venv), "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps",
                 "-w", str(work / "dist"), str(src)], 1800, env=env)
    print(f"\nCUDA wheel build: {time.monotonic() - begin:.0f}s on {os.cpu_count()} cores")
    assert "kernel_build: cuda" in proc.stdout + proc.stderr, "setup.py built no kernels"
    (path,) = (work / "dist").glob("megatron_frontier-*.whl")
    _run([str(cuda_venv), "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
          "--force-reinstall", str(path)], 600)
    return path


def _members(wheel_path):
    with zipfile.ZipFile(wheel_path) as zf:
        return {name: zf.read(name) for name in zf.namelist()
                if name.startswith("megatron/kernels/_")}


def _module_file(members, module):
    (name,) = [n for n in members if n.startswith(f"megatron/kernels/{module}.") and
               n.endswith(".so")]
    return members[name]


def test_wheel_holds_every_module_and_the_build_record(wheel, cuda_venv):
    members = _members(wheel)
    for module in MODULES:
        assert _module_file(members, module)
    info = json.loads(members["megatron/kernels/_build_info.json"])
    torch_version = _run([str(cuda_venv), "-c", "import torch; print(torch.__version__, "
                          "torch.version.cuda)"], 120).stdout.split()
    assert info["vendor"] == "cuda" and info["archs"] == list(ARCHS) and not info["ptx"]
    assert [info["torch"], info["toolkit"]] == torch_version
    assert {m: set(ops) for m, ops in info["modules"].items()} == {
        "_fused_softmax": {"scaled_masked_softmax", "scaled_causal_softmax"},
        "_fused_norm": {"layer_norm", "rms_norm"}, "_fused_rotary": {"rotary"},
        "_fused_activation": {"bias_gelu", "swiglu"}}


def test_wheel_holds_the_data_the_package_reads(wheel):
    """The planner's published runs (megatron-plan's validation) and the kernel catalog, which
    tools/kernel_build.py reads by path, travel in the wheel."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert {"megatron/planner/published.yaml", "megatron/kernels/catalog.py"} <= names


@pytest.mark.parametrize("module", sorted(MODULES))
def test_fatbin_holds_sm80_and_sm90_with_every_kernel(wheel, module):
    unit = MODULES[module][0]
    cubins = cuda_cubins(_module_file(_members(wheel), module))
    assert set(ARCHS) <= set(cubins), f"{module}: fatbin holds {sorted(cubins)}"
    for arch in ARCHS:
        check_kernels(defined_kernels(cubins[arch], amd=False), unit, arch)
    assert sum(EXPECTED_KERNELS.values()) == 148  # the per-arch total the docs quote


def test_modules_import_under_the_cuda_torch(wheel, cuda_venv, tmp_path):
    script = ("import importlib, json, torch\n"
              "out = {}\n"
              f"for m in {sorted(MODULES)!r}:\n"
              "    mod = importlib.import_module('megatron.kernels.' + m)\n"
              "    out[m] = sorted(n for n in dir(mod) if not n.startswith('_'))\n"
              "print(json.dumps(out))\n")
    got = json.loads(_run([str(cuda_venv), "-c", script], 300, cwd=tmp_path).stdout)
    assert got == {m: sorted(funcs) for m, (_, funcs) in MODULES.items()}


def _report(python, tmp_path, *args, env=None):
    return subprocess.run([str(python), "-m", "megatron.cli.kernels", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env)


def test_report_under_the_cuda_torch(wheel, cuda_venv, tmp_path):
    proc = _report(cuda_venv, tmp_path, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["build"]["archs"] == list(ARCHS)
    assert report["build_mismatch"] == "no GPU is visible to torch"
    assert all(op["built"] and not op["runs_here"] for op in report["ops"]), report["ops"]
    assert _report(cuda_venv, tmp_path, "--require").returncode == 1


def test_report_under_a_mismatched_torch(wheel, tmp_path):
    """The same wheel's files under this checkout's CPU torch: the mismatch is named, with the
    fix, and --require fails."""
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp_path / "wheel")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "wheel"))
    proc = _report(sys.executable, tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "built for cuda but this torch is a cpu build" in proc.stdout
    assert "TORCH_CUDA_ARCH_LIST" in proc.stdout
    assert _report(sys.executable, tmp_path, "--require", env=env).returncode == 1


def test_a_cuda_home_without_headers_is_named(cuda_venv, tmp_path):
    env = dict(os.environ, CUDA_HOME=str(tmp_path))
    script = "import kernel_build; kernel_build.kernel_extensions()"
    proc = subprocess.run([str(cuda_venv), "-c", script], capture_output=True, text=True,
                          timeout=300, env=dict(env, PYTHONPATH=os.path.join(ROOT, "tools")))
    assert proc.returncode != 0
    assert f"CUDA_HOME='{tmp_path}' has no include/cuda_runtime.h" in proc.stderr
