"""config/environ.py: the MEGATRON_* variables the framework reads are one table (docs/config.md's
"Environment variables"), every name the code and scripts read is in it, and any other
MEGATRON_* variable of a job's environment is named, with the known names closest to it, in one
warning of megatron-train and the job chain (tests/integration/test_training_chain_sh.py holds
the chain's)."""
import os
import re

from megatron.config import environ
from tests.support.paths import ROOT

READ = re.compile(r"(?<![A-Za-z0-9_])MEGATRON_[A-Z0-9_]*[A-Z0-9]")


def _read_in(*tops):
    seen = set()
    for top in tops:
        paths = [os.path.join(ROOT, top)] if top == "Makefile" else (
            os.path.join(folder, name) for folder, _, files in os.walk(os.path.join(ROOT, top))
            for name in files if name.endswith((".py", ".sh", ".sbatch")))
        for path in paths:
            if path.endswith(os.path.join("config", "environ.py")):  # its own misspelt examples
                continue
            with open(path, errors="replace") as f:
                seen |= set(READ.findall(f.read()))
    return seen


def test_every_variable_the_code_and_scripts_read_is_known():
    """The package, its scripts and the Makefile read nothing the table lacks; each entry is
    read there, or by the tests when it says "tests only"."""
    code = _read_in("megatron", "examples", "tools", "Makefile")
    missing = sorted(n for n in code if n not in environ.KNOWN
                     and not (n + "_").startswith(environ.TEST_PREFIX))  # fault injections
    assert not missing, f"read but not in base/environ.KNOWN: {missing}"
    tests = _read_in("tests")
    for name, what in environ.KNOWN.items():
        assert name in (tests if "(tests only)" in what else code), name


def test_a_misspelt_variable_is_named_with_the_closest_known_ones():
    env = {"MEGATRON_CHAIN_MAX_ATTEMPT": "50", "MEGATRON_PLUGIN": "mypkg.variants",
           "MEGATRON_CHAIN": "0", "MEGATRON_TEST_CORRUPT": "1", "PATH": "/bin",
           "MEGATRON_WHATEVER": "x"}
    lines = environ.unknown(env)
    assert lines == ["MEGATRON_CHAIN_MAX_ATTEMPT='50' (did you mean MEGATRON_CHAIN_MAX_ATTEMPTS?)",
                     "MEGATRON_PLUGIN='mypkg.variants' (did you mean MEGATRON_PLUGINS?)",
                     "MEGATRON_WHATEVER='x'"], lines
    note = environ.unknown_note(env)
    assert note.startswith("environment variable(s) that nothing in this framework reads")
    assert "docs/config.md" in note
    assert environ.unknown_note({"MEGATRON_CHAIN": "0", "HOME": "/root"}) == ""
