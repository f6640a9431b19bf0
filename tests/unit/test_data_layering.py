"""megatron/data is library code: it imports only megatron.config and itself (never training,
model or parallel), never prints, never exits, never parses argv. That preprocessing never
imports torch is tests/integration/test_data_preprocess_imports.py."""
import ast
import pathlib

DATA = pathlib.Path(__file__).resolve().parents[2] / "megatron" / "data"


def _modules():
    for path in sorted(DATA.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def test_data_imports_only_config_and_itself():
    for path, tree in _modules():
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                if name.startswith("megatron."):
                    assert name.split(".")[1] in ("config", "data"), f"{path}: imports {name}"


def test_data_never_prints_exits_or_parses_argv():
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("print", "exit", "quit"), f"{path}:{node.lineno}"
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                assert (node.value.id, node.attr) not in (("sys", "exit"), ("sys", "argv")), \
                    f"{path}:{node.lineno}"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert "argparse" not in mods, f"{path}: argparse belongs in megatron/cli"
