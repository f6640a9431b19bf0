"""Load-time validation of the kernel build (megatron/kernels/loader.py), KernelSelection, and the
megatron-kernels CLI, on the CPU. Build records are written to temp files; the GPU architecture
and the torch toolkit are faked where a case needs a GPU."""
from __future__ import annotations

import json
import logging
import os
import sys

import pytest
import torch

from megatron.cli import kernels as cli
from megatron.config.errors import ConfigError
from megatron.kernels import catalog, loader, ops, registry
from tests.support.paths import ROOT

GPU = torch.device("cuda", 0)


def info(**over):
    data = {"vendor": "rocm", "torch": torch.__version__, "toolkit": "6.2.4", "archs": ["gfx90a"],
            "modules": {m: list(o) for m, (_, o) in catalog.MODULES.items()}}
    data.update(over)
    return loader.BuildInfo.from_json(data)


@pytest.mark.parametrize("built,gpu,runs", [
    ("gfx90a", "gfx90a", True), ("gfx90a", "gfx90a:sramecc+:xnack-", True),
    ("gfx90a", "gfx942", False), ("gfx942", "gfx90a", False),
    ("sm_80", "sm_80", True), ("sm_80", "sm_86", True), ("sm_80", "sm_90", False),
    ("sm_90", "sm_80", False), ("sm_90a", "sm_90", True), ("sm_90a", "sm_100", False),
    ("sm_100", "sm_100", True), ("sm_90", "gfx90a", False),
])
def test_arch_compatibility(built, gpu, runs):
    assert loader.arch_runs(built, gpu) is runs, f"code for {built} on a {gpu}"


def test_mismatches_name_what_differs_and_how_to_fix(monkeypatch):
    monkeypatch.setattr(loader, "torch_toolkit", lambda: ("rocm", "6.2.4"))
    assert loader.build_mismatch(info(), "gfx90a") is None
    msg = loader.build_mismatch(info(), "gfx942")
    assert "gfx90a" in msg and "gfx942" in msg and "PYTORCH_ROCM_ARCH" in msg
    msg = loader.build_mismatch(info(torch="2.0.0+rocm5.6"), "gfx90a")
    assert "2.0.0+rocm5.6" in msg and torch.__version__ in msg and "pip install" in msg
    assert "built for cuda" in loader.build_mismatch(info(vendor="cuda"), "gfx90a")
    monkeypatch.setattr(loader, "torch_toolkit", lambda: ("rocm", "6.3.0"))
    assert "6.2.4" in loader.build_mismatch(info(), "gfx90a")


def test_unavailable_reasons(monkeypatch, tmp_path):
    assert "CPU" in loader.unavailable_reason("rms_norm", torch.device("cpu"))
    monkeypatch.setattr(loader, "BUILD_INFO_PATH", tmp_path / "absent.json")
    assert "no fused kernel build" in loader.unavailable_reason("rms_norm", GPU)
    monkeypatch.setattr(loader, "torch_toolkit", lambda: ("rocm", "6.2.4"))
    monkeypatch.setattr(loader, "gpu_arch", lambda index=0: "gfx90a")
    only_norm = info(modules={"_fused_norm": ["layer_norm", "rms_norm"]})
    assert "has no fused swiglu" in loader.unavailable_reason("swiglu", GPU, only_norm)
    # Everything matches, but the compiled module does not import (missing, or an ABI break).
    def broken(name):
        raise ImportError(f"No module named megatron.kernels.{name}")
    monkeypatch.setattr(loader, "load_module", broken)
    assert "does not import" in loader.unavailable_reason("rms_norm", GPU, only_norm)
    monkeypatch.setattr(loader, "load_module", lambda name: object())
    assert loader.unavailable_reason("rms_norm", GPU, only_norm) is None
    with pytest.raises(KeyError):
        loader.unavailable_reason("flash", GPU)


def test_build_info_file_round_trip(tmp_path):
    path = tmp_path / "_build_info.json"
    assert loader.load_build_info(path) is None
    path.write_text(json.dumps({"vendor": "cuda", "torch": "2.5.1+cu124", "toolkit": "12.4",
                                "archs": ["sm_80", "sm_90"], "ptx": False,
                                "modules": {"_fused_rotary": ["rotary"]}}))
    b = loader.load_build_info(path)
    assert b.archs == ["sm_80", "sm_90"] and b.ops() == ["rotary"]
    path.write_text("{not json")
    with pytest.raises(RuntimeError, match="unreadable"):
        loader.load_build_info(path)


def test_the_build_tool_reads_the_one_catalog():
    """tools/kernel_build.py builds exactly the catalog's modules from the catalog's sources, and
    every op the selection knows is in it, each record with its catalog module and sources."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import kernel_build
    assert kernel_build.MODULES == catalog.MODULES
    assert registry.names() == list(catalog.OPS) and set(catalog.MODULE_OF) == set(catalog.OPS)
    assert len(catalog.OPS) == len(set(catalog.OPS)) == 7
    for op in registry.records():
        assert (op.module, op.sources) == (catalog.MODULE_OF[op.name],
                                           catalog.MODULES[op.module][0]), op.name


def test_selection_modes(caplog):
    assert not any(ops.KernelSelection("torch").use_fused.values())
    with caplog.at_level(logging.INFO, logger="megatron.kernels.ops"):
        sel = ops.KernelSelection("auto", torch.device("cpu"))
    assert not any(sel.use_fused.values()) and set(sel.reasons) == set(registry.names())
    fallbacks = [r for r in caplog.records if "torch reference" in r.getMessage()]
    assert len(fallbacks) == 1, "auto logs one line for one shared reason"
    with pytest.raises(ConfigError, match="kernels.mode.*use kernels.mode=auto or torch"):
        ops.KernelSelection("fused", torch.device("cpu"))


def test_cli_help_has_examples(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "PYTORCH_ROCM_ARCH" in out and "TORCH_CUDA_ARCH_LIST" in out


def test_cli_reports_on_this_machine(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(loader, "BUILD_INFO_PATH", tmp_path / "absent.json")
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert "none installed" in out and "apex" in out and "flash-attn" in out
    for op in registry.names():
        assert op in out
    assert cli.main(["--require"]) == 1, "--require fails when an op cannot run"
    capsys.readouterr()
    assert cli.main(["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {o["op"] for o in data["ops"]} == set(registry.names())
    assert {t["name"] for t in data["third_party"]} == {"apex", "flash-attn"}


def test_cli_reports_a_mismatched_build(capsys, monkeypatch, tmp_path):
    path = tmp_path / "_build_info.json"
    path.write_text(json.dumps({"vendor": "rocm", "torch": "2.4.0+rocm6.1", "toolkit": "6.1",
                                "archs": ["gfx90a"], "modules": {"_fused_norm": ["rms_norm"]}}))
    monkeypatch.setattr(loader, "BUILD_INFO_PATH", path)
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert "rocm 6.1, torch 2.4.0+rocm6.1, for gfx90a" in out
    assert "built for rocm but this torch" in out
