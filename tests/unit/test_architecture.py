"""The import direction of docs/architecture.md, enforced: each package of megatron/ imports only
the packages below it, and deepspeed is imported only by megatron/engine/. Lazy imports inside
functions count as imports. (That config and planner import without torch is checked in a fresh
process: tests/integration/test_planner_torch_free_imports.py.)"""
from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Dict, Iterator, Set, Tuple

import pytest

from tests.support.paths import ROOT

REPO = Path(ROOT)
PACKAGE = REPO / "megatron"

# Package -> the packages it may import (docs/architecture.md draws the same layers).
BELOW: Dict[str, Set[str]] = {
    "config": set(),
    # torch-free records and file rules (run directory, commit files, meta.json and metrics.jsonl
    # records, deepspeed.json, the optimizer kind): the ground floor beside config
    "base": {"config"},
    "launch": {"config", "base"},
    "data": {"config", "base"},
    # torch-free, below the model: reads the records, never the packages that build a run
    "planner": {"config", "base", "launch"},
    "parallel": {"config", "base", "launch"},
    "kernels": {"config", "base", "launch"},
    "model": {"config", "base", "launch", "parallel", "kernels"},
    "checkpoint": {"config", "base", "launch", "parallel", "kernels", "model", "data"},
    "engine": {"config", "base", "launch", "parallel", "kernels", "model", "checkpoint"},
    "training": {"config", "base", "launch", "parallel", "kernels", "model", "data",
                 "checkpoint", "engine"},
    "cli": {"config", "base", "launch", "parallel", "kernels", "model", "data", "checkpoint",
            "engine", "planner", "training"},
}


def imports(path: Path) -> Iterator[Tuple[str, int]]:
    """(module, line) for every absolute import in the file, at any depth."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module, node.lineno
            for alias in node.names:  # "from megatron import x" names a package
                if node.module == "megatron":
                    yield f"megatron.{alias.name}", node.lineno


def package_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else ""


def sources():
    return sorted(PACKAGE.rglob("*.py"))


def test_every_package_has_a_place_in_the_layers():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(BELOW), ("a package was added or removed: give it its row in BELOW "
                                    "and in docs/architecture.md")
    for name, allowed in BELOW.items():
        assert allowed <= set(BELOW) - {name}


def test_packages_import_only_what_lies_below_them():
    wrong = []
    for path in sources():
        own = package_of(path)
        for module, line in imports(path):
            parts = module.split(".")
            if parts[0] != "megatron" or len(parts) < 2 or parts[1] == own or not own:
                continue
            target = parts[1]
            if target not in BELOW.get(own, set()):
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {module}: '{own}' may "
                             f"import only {sorted(BELOW[own]) or 'nothing of megatron'}")
    assert not wrong, "\n".join(wrong)


def test_only_the_engine_imports_deepspeed():
    wrong = [f"{path.relative_to(REPO)}:{line} imports {module}"
             for path in sources() if package_of(path) != "engine"
             for module, line in imports(path) if module.split(".")[0] == "deepspeed"]
    assert not wrong, "only megatron/engine/ may import deepspeed:\n" + "\n".join(wrong)


def test_the_layers_have_no_cycle():
    seen: Dict[str, int] = {}

    def depth(name: str, path: Tuple[str, ...] = ()) -> int:
        assert name not in path, f"cycle: {' -> '.join(path + (name,))}"
        if name not in seen:
            seen[name] = 1 + max((depth(d, path + (name,)) for d in BELOW[name]), default=0)
        return seen[name]

    for name in BELOW:
        depth(name)


def test_the_rule_catches_an_upward_import(tmp_path, monkeypatch):
    """The check itself: a config module importing the model is reported."""
    fake = tmp_path / "megatron"
    (fake / "config").mkdir(parents=True)
    (fake / "config" / "__init__.py").write_text("")
    (fake / "config" / "bad.py").write_text("def f():\n    from megatron.model import gpt\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    with pytest.raises(AssertionError, match=r"config/bad.py:2 imports megatron.model"):
        test_packages_import_only_what_lies_below_them()


def test_the_loop_reads_in_one_sitting():
    """training/loop.py keeps train() and the loop (the components own their policies); no
    function of the training package runs past 40 lines."""
    loop = PACKAGE / "training" / "loop.py"
    assert len(loop.read_text().splitlines()) <= 200, "training/loop.py grew past 200 lines"
    long = []
    for path in sorted((PACKAGE / "training").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 40:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {lines}")
    assert not long, "functions over 40 lines:\n" + "\n".join(long)
