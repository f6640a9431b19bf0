"""megatron-plan and config checks run on a login node without torch or DeepSpeed: importing every
module of config, base (the records the planner reads) and planner loads neither
(docs/architecture.md). Each check is a fresh interpreter, since this one has torch."""
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

EVERY_MODULE = ("import importlib, pkgutil\n"
                "import megatron.{0} as p\n"
                "for m in pkgutil.iter_modules(p.__path__):\n"
                "    importlib.import_module('megatron.{0}.' + m.name)\n")


@pytest.mark.parametrize("imports", [
    EVERY_MODULE.format("config"),
    EVERY_MODULE.format("planner"),
    EVERY_MODULE.format("base"),
    "import megatron.cli.plan, megatron.cli.plan_commands, megatron.cli.plan_calibrate\n",
], ids=["config", "planner", "base", "megatron-plan"])
def test_imports_load_neither_torch_nor_deepspeed(imports):
    code = imports + "import sys\nprint(sorted(k for k in ('torch', 'deepspeed') if k in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
