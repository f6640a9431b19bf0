"""Fused ops as records (megatron/kernels/registry.py): an op defined here, outside the package,
with one registration call, is listed by megatron-kernels, dispatched to its reference on the
CPU, and refused with the built-in ops' error when kernels.mode=fused asks for it; the records
are checked when registered; and no module of megatron/kernels branches on an op's name.
A failure names the step of an op's life (listing, selection, dispatch) that ignores records."""
from __future__ import annotations

import ast
import inspect
import json
import logging
from pathlib import Path

import pytest
import torch

from megatron import kernels
from megatron.cli import kernels as cli
from megatron.config.errors import ConfigError
from megatron.kernels import catalog, loader, ops, registry
from tests.support.paths import ROOT

GPU = torch.device("cuda", 0)
PACKAGE = Path(ROOT, "megatron", "kernels")


def scaled_tanh_reference(x: torch.Tensor, scale: float) -> torch.Tensor:
    """The toy op: y = tanh(x) * scale, math in fp32, result in x's dtype."""
    return (torch.tanh(x.float()) * scale).to(x.dtype)


def register_scaled_tanh() -> registry.FusedOp:
    return registry.register("scaled_tanh", scaled_tanh_reference)


@pytest.fixture(autouse=True)
def scoped_registry(monkeypatch):
    # Registrations made by a test end with it: the other kernel tests count the built-in ops.
    monkeypatch.setattr(registry, "_RECORDS", dict(registry._RECORDS))


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """A GPU on which every built-in op runs: a matching build record, every module imports."""
    def use_build(modules):
        path = tmp_path / "_build_info.json"
        path.write_text(json.dumps({"vendor": "rocm", "torch": torch.__version__,
                                    "toolkit": "6.2.4", "archs": ["gfx90a"],
                                    "modules": modules}))
        monkeypatch.setattr(loader, "BUILD_INFO_PATH", path)

    monkeypatch.setattr(loader, "torch_toolkit", lambda: ("rocm", "6.2.4"))
    monkeypatch.setattr(loader, "gpu_arch", lambda index=0: "gfx90a")
    monkeypatch.setattr(loader, "load_module", lambda name: object())
    use_build({m: list(o) for m, (_, o) in catalog.MODULES.items()})
    return use_build


def test_megatron_kernels_lists_a_registered_op(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(loader, "BUILD_INFO_PATH", tmp_path / "absent.json")
    register_scaled_tanh()
    assert cli.main([]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["scaled_tanh", "-", "no", "no"] in [row[:4] for row in rows], \
        "the text report has no row for the registered op"
    assert cli.main(["--json"]) == 0
    status = {o["op"]: o for o in json.loads(capsys.readouterr().out)["ops"]}
    assert status["scaled_tanh"]["module"] is None and not status["scaled_tanh"]["runs_here"]
    assert list(status) == list(catalog.OPS) + ["scaled_tanh"], "catalog order, then the new op"


@pytest.mark.parametrize("mode", ["torch", "auto"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dispatch_runs_the_reference_with_the_cpu_selection(mode, dtype):
    register_scaled_tanh()
    sel = kernels.KernelSelection(mode, torch.device("cpu"))
    assert sel.use_fused["scaled_tanh"] is False
    x = torch.linspace(-3, 3, 25).to(dtype)
    y = kernels.dispatch("scaled_tanh", sel, x, 2.5)
    assert y.dtype == dtype
    torch.testing.assert_close(y.float(), (torch.tanh(x.float()) * 2.5).to(dtype).float())


def test_auto_logs_the_new_op_with_the_others_once(caplog):
    register_scaled_tanh()
    with caplog.at_level(logging.INFO, logger="megatron.kernels.ops"):
        kernels.KernelSelection("auto", torch.device("cpu"))
    lines = [r.getMessage() for r in caplog.records if "torch reference" in r.getMessage()]
    assert len(lines) == 1 and "scaled_tanh" in lines[0], lines


def test_fused_mode_refuses_an_op_without_a_built_extension_as_for_a_built_in(fake_gpu):
    sel = kernels.KernelSelection("fused", GPU)
    assert all(sel.use_fused.values()), "the fake GPU must run every built-in op"
    register_scaled_tanh()
    with pytest.raises(ConfigError, match=r"kernels.mode='fused' is invalid: .*fused scaled_tanh "
                       r"is unavailable \(scaled_tanh has no compiled kernel.*"
                       r"use kernels.mode=auto or torch"):
        kernels.KernelSelection("fused", GPU)
    # The same error a built-in op gets when its extension is not in the build.
    fake_gpu({m: list(o) for m, (_, o) in catalog.MODULES.items() if m != "_fused_rotary"})
    registry._RECORDS.pop("scaled_tanh")
    with pytest.raises(ConfigError, match=r"kernels.mode='fused' is invalid: .*fused rotary is "
                       r"unavailable \(this build has no fused rotary.*use kernels.mode=auto"):
        kernels.KernelSelection("fused", GPU)


def test_auto_on_a_gpu_falls_back_for_the_new_op_only(fake_gpu):
    register_scaled_tanh()
    sel = kernels.KernelSelection("auto", GPU)
    assert sel.use_fused == {**{op: True for op in catalog.OPS}, "scaled_tanh": False}
    x = torch.randn(7)
    torch.testing.assert_close(kernels.dispatch("scaled_tanh", sel, x, 0.5),
                               scaled_tanh_reference(x, 0.5))


def test_records_are_checked_when_registered():
    register_scaled_tanh()
    with pytest.raises(ValueError, match="registered twice"):
        register_scaled_tanh()
    with pytest.raises(ValueError, match="no extension module builds it.*catalog.py"):
        registry.register("scaled_exp", torch.exp, fused=torch.exp, accepts=lambda x: True)
    registry._RECORDS.pop("rotary")
    with pytest.raises(ValueError, match="compiled into _fused_rotary.*no fused path"):
        registry.register("rotary", scaled_tanh_reference)
    with pytest.raises(RuntimeError, match="catalog.py lists rotary but no file registers it"):
        registry.check_complete()
    with pytest.raises(KeyError, match="unknown fused op 'flash'"):
        kernels.dispatch("flash", ops.KernelSelection(), torch.ones(1))


def test_the_wrappers_keep_the_signatures_the_model_calls():
    want = {"layer_norm": "x weight bias eps sel", "rms_norm": "x weight eps sel",
            "scaled_masked_softmax": "scores mask scale sel",
            "scaled_causal_softmax": "scores scale sel", "rotary": "x cos sin sel",
            "bias_gelu": "x bias sel", "swiglu": "gate up sel"}
    assert set(want) == set(catalog.OPS), "every built-in op has a wrapper in megatron.kernels"
    for name, params in want.items():
        assert " ".join(inspect.signature(getattr(kernels, name)).parameters) == params, name


def name_branches(source: str, names) -> list:
    """Lines that compare a value with an op name, match on one, or key a table by one:
    each is a branch on an op's name that a record should carry instead."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        elif isinstance(node, ast.Dict):
            operands = [key for key in node.keys if key is not None]
        else:
            continue
        strings = {c.value for o in operands for c in ast.walk(o)
                   if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        if strings & set(names):
            found.append(node.lineno)
    return found


def test_no_module_of_the_kernels_package_branches_on_an_op_name():
    names = set(catalog.OPS) | set(registry.names())
    branches = {path.relative_to(PACKAGE).as_posix(): name_branches(path.read_text(), names)
                for path in sorted(PACKAGE.rglob("*.py"))}
    branches = {rel: lines for rel, lines in branches.items() if lines}
    assert not branches, \
        f"megatron/kernels: put the op's behaviour in its FusedOp record instead: {branches}"


def test_the_scan_catches_if_chains_tables_and_matches():
    names = {"rms_norm", "layer_norm"}
    chain = ('def accepts(op, x):\n    if op == "rms_norm":\n        return True\n'
             '    elif op in ("layer_norm", "other"):\n        return False\n')
    assert name_branches(chain, names) == [2, 4]
    assert name_branches('TABLE = {"rms_norm": 1}\n', names) == [1]
    assert name_branches('match op:\n    case "layer_norm":\n        pass\n', names) == [2]
    assert name_branches('register("rms_norm", f)\nif mode == "fused":\n    pass\n', names) == []
