"""The layout of tests/ (docs/architecture.md, "Tests"): tests/unit starts no process, ROOT is
defined once (tests/support/paths.py), and every module that is not a test lives in
tests/support/ (or is one of the e2e tests' own helpers). Every test file is named
test_<package>_<what>.py after the megatron/ package it tests, and the table of
docs/architecture.md, "Tests by package", lists each one in its package's row. Read from the
sources, nothing run."""
import ast
import re
from pathlib import Path

from tests.support.paths import ROOT

TESTS = Path(ROOT, "tests")
UNIT = TESTS / "unit"
# Helpers that only the e2e tests use stay beside them.
E2E_HELPERS = {"e2e/e2e_helpers.py", "e2e/slurm_cluster.py"}
# The directories that hold tests, and the tests that hold the layers, this layout and the
# tests' own shared launches instead of one package.
TEST_DIRS = ("unit", "integration", "distributed", "e2e", "gpu")
META_TESTS = {"unit/test_architecture.py", "unit/test_test_layout.py",
              "integration/test_test_shared_launches.py"}
ARCHITECTURE_MD = Path(ROOT, "docs", "architecture.md")
TABLE_HEADING = "## Tests by package"
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


def _packages() -> list:
    return sorted(p.name for p in Path(ROOT, "megatron").iterdir() if (p / "__init__.py").is_file())


def _test_files() -> list:
    return sorted(path.relative_to(TESTS).as_posix() for d in TEST_DIRS
                  for path in (TESTS / d).glob("test_*.py"))


def _package_of(rel: str, packages) -> str:
    """The package a test file is named after ("meta" for the meta tests), or "" for none."""
    if rel in META_TESTS:
        return "meta"
    name = Path(rel).name
    found = [p for p in packages if name.startswith(f"test_{p}_")]
    return max(found, key=len) if found else ""


def _table(text: str) -> dict:
    """{"<dir>/<file>": row} from the table under TABLE_HEADING: a row per package, a column per
    test directory (headed tests/<dir>), file names in backticks."""
    section = text.split(TABLE_HEADING + "\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|")]
    header, body = rows[0], rows[2:]
    dirs = [h.removeprefix("tests/") for h in header[1:]]
    listed = {}
    for row in body:
        package = row[0].strip("`")
        for d, cell in zip(dirs, row[1:]):
            for name in re.findall(r"`([^`]+)`", cell):
                assert f"{d}/{name}" not in listed, f"{d}/{name} is listed twice"
                listed[f"{d}/{name}"] = package
    return listed


def test_every_test_file_is_named_after_its_package():
    packages = _packages()
    assert {"config", "training", "cli"} <= set(packages)
    unnamed = [rel for rel in _test_files() if not _package_of(rel, packages)]
    assert not unnamed, (f"name each test file test_<package>_<what>.py, <package> one of "
                         f"{packages}: {unnamed}")


def test_the_table_in_architecture_md_lists_every_test_file_in_its_package_row():
    listed = _table(ARCHITECTURE_MD.read_text())
    files = _test_files()
    missing = sorted(set(files) - set(listed))
    assert not missing, f"add to docs/architecture.md, {TABLE_HEADING!r}: {missing}"
    gone = sorted(rel for rel in listed if not (TESTS / rel).is_file())
    assert not gone, f"listed in docs/architecture.md but not in tests/: {gone}"
    packages = _packages()
    misplaced = {rel: row for rel, row in listed.items() if _package_of(rel, packages) != row}
    assert not misplaced, f"in another package's row: {misplaced}"
    assert set(listed.values()) == set(packages) | {"meta"}, "a row for every package"


def test_the_naming_rule_and_the_table_reader():
    packages = ["data", "model", "training"]
    assert _package_of("unit/test_data_cache.py", packages) == "data"
    assert _package_of("e2e/test_training_gpu.py", packages) == "training"
    assert _package_of("unit/test_architecture.py", packages) == "meta"
    assert _package_of("unit/test_hf_export.py", packages) == ""
    assert _package_of("unit/test_datax_cache.py", packages) == ""
    text = (f"# A\n\n{TABLE_HEADING}\n\nintro\n\n| package | tests/unit | tests/e2e |\n"
            "|---|---|---|\n| `data` | `test_data_a.py`, `test_data_b.py` |  |\n"
            "| meta | | `test_x.py` |\n\n## Later\n| `model` | `test_model_c.py` | |\n")
    assert _table(text) == {"unit/test_data_a.py": "data", "unit/test_data_b.py": "data",
                            "e2e/test_x.py": "meta"}
