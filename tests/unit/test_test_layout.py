"""The layout of tests/ (docs/architecture.md, "Tests"): tests/unit starts no process, ROOT is
defined once (tests/support/paths.py), and every module that is not a test lives in
tests/support/ (or is one of the e2e tests' own helpers). Read from the sources, nothing run."""
import ast
from pathlib import Path

from tests.support.paths import ROOT

TESTS = Path(ROOT, "tests")
UNIT = TESTS / "unit"
# Helpers that only the e2e tests use stay beside them.
E2E_HELPERS = {"e2e/e2e_helpers.py", "e2e/slurm_cluster.py"}
PROCESS_MODULES = {"subprocess", "multiprocessing", "torch.multiprocessing",
                   "tests.support.procs"}


def _modules():
    for path in sorted(TESTS.rglob("*.py")):
        if "__pycache__" not in path.parts:
            yield path.relative_to(TESTS).as_posix(), ast.parse(path.read_text(), str(path))


def _launches(tree) -> list:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name in PROCESS_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module in PROCESS_MODULES:
            found.append(node.module)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests.integ"):
            found.append(node.module)
        elif isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name.split(".")[-1] == "torchrun":
                found.append(f"{name}()")
    return found


def _assigns_root(tree) -> bool:
    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign))
                   else [])
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name) and name.id == "ROOT":
                    return True
    return False


def test_unit_tests_start_no_process():
    launching = {}
    for rel, tree in _modules():
        if rel.startswith("unit/"):
            found = _launches(tree)
            if found:
                launching[rel] = found
    assert not launching, ("tests that start processes belong in tests/integration/ (or "
                           f"tests/distributed/, tests/e2e/): {launching}")


def test_root_is_defined_once():
    defining = [rel for rel, tree in _modules() if _assigns_root(tree)]
    assert "support/paths.py" in defining
    others = sorted(set(defining) - {"support/paths.py"})
    assert not others, f"import ROOT from tests.support.paths instead of defining it: {others}"


def test_every_module_that_is_not_a_test_lives_in_support():
    stray = [rel for rel, _ in _modules()
             if not rel.startswith("support/") and rel not in E2E_HELPERS
             and Path(rel).name not in ("conftest.py", "__init__.py")
             and not Path(rel).name.startswith("test_")]
    assert not stray, f"helpers, workers and fixture modules belong in tests/support/: {stray}"


def test_tests_import_helpers_from_support_not_from_other_tests():
    """A helper two test files share lives in tests/support/, not in one of them."""
    borrowing = {}
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if (isinstance(node, ast.ImportFrom) and node.module
                    and node.module.startswith("tests.")
                    and node.module.split(".")[-1].startswith("test_")):
                borrowing.setdefault(rel, []).append(node.module)
    assert not borrowing, f"move what these import into tests/support/: {borrowing}"


def test_the_rules_catch_a_launch_and_a_root():
    tree = ast.parse("import subprocess\nfrom tests.support.procs import torchrun\n"
                     "torchrun(2, 'w.py')\nROOT = '/'\n")
    assert _launches(tree) == ["subprocess", "tests.support.procs", "torchrun()"]
    assert _assigns_root(tree)
    assert not _launches(ast.parse("from tests.support.paths import ROOT\n"))
    assert not _assigns_root(ast.parse("from tests.support.paths import ROOT\n"))
