"""The network preflight (megatron/launch/preflight.py) loading real shared objects: small fake
plugin and libfabric libraries built here with the C compiler, each check in a fresh process,
because dlopen reads LD_LIBRARY_PATH only at process start and remembers every library it has
loaded."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.support.paths import ROOT


# --- loading real shared objects, each check in a fresh process ------------------------------

FABRIC_C = "int fi_version(void) { return 0x10016; }\n"
PLUGIN_C = """
int fi_version(void);
struct net { const char *name; int (*version)(void); };
struct net ncclNetPlugin_v8 = { "Libfabric", fi_version };
"""
NOT_A_PLUGIN_C = "int something_else = 1;\n"


def _cc(out, source, *extra):
    src = str(out) + ".c"
    with open(src, "w") as f:
        f.write(source)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), src, *extra], check=True)


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build the fake plugin and libfabric")
    d = tmp_path_factory.mktemp("netlibs")
    fabric, plugin, stray = d / "fabric", d / "plugin", d / "stray"
    for sub in (fabric, plugin, stray):
        sub.mkdir()
    _cc(fabric / "libfabric.so.1", FABRIC_C, "-Wl,-soname,libfabric.so.1")
    link = ["-L", str(fabric), "-l:libfabric.so.1"]  # resolved at load time: no rpath
    _cc(plugin / "librccl-net.so", PLUGIN_C, *link)
    _cc(plugin / "libnccl-net-ofi.so", PLUGIN_C, *link)
    _cc(stray / "libnothing.so", NOT_A_PLUGIN_C)
    return {"fabric": str(fabric), "plugin": str(plugin), "stray": str(stray)}


PROBE = """
import json, sys
from megatron.config.errors import InputError
from megatron.launch.env import LaunchEnv
from megatron.launch.preflight import check_network
try:
    r = check_network(LaunchEnv(0, 16, 0, "n1", 29500, "slurm", 2), "rocm", slingshot=False)
    print(json.dumps({"ran": r.ran, "plugin": r.plugin}))
except InputError as e:
    print(json.dumps({"error": str(e)}))
"""


def probe(**env):
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("NCCL_", "MEGATRON_NET")) and k != "LD_LIBRARY_PATH"}
    clean.update(PYTHONPATH=ROOT, **env)
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env=clean, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_plugin_and_libfabric_on_the_library_path_load(libs):
    r = probe(NCCL_NET="OFI", LD_LIBRARY_PATH=f"{libs['plugin']}:{libs['fabric']}")
    assert r == {"ran": True, "plugin": os.path.join(libs["plugin"], "librccl-net.so")}


def test_plugin_named_by_suffix(libs):
    r = probe(NCCL_NET="OFI", NCCL_NET_PLUGIN="ofi",
              LD_LIBRARY_PATH=f"{libs['plugin']}:{libs['fabric']}")
    assert r["plugin"] == os.path.join(libs["plugin"], "libnccl-net-ofi.so")


def test_missing_plugin_is_refused(libs):
    r = probe(NCCL_NET="OFI", LD_LIBRARY_PATH=libs["fabric"])
    assert "no network plugin can be loaded" in r["error"]
    assert "librccl-net.so, libnccl-net.so" in r["error"] and libs["fabric"] in r["error"]


def test_missing_libfabric_is_refused(libs):
    r = probe(NCCL_NET="OFI", LD_LIBRARY_PATH=libs["plugin"])
    assert "libfabric cannot be loaded" in r["error"]


def test_plugin_whose_libfabric_is_missing_is_refused(libs, tmp_path):
    # libfabric itself is found (an unrelated copy named by path), the plugin's own link is not.
    r = probe(NCCL_NET_PLUGIN=os.path.join(libs["plugin"], "librccl-net.so"),
              LD_LIBRARY_PATH=str(tmp_path))
    assert "cannot be loaded" in r["error"] and "libfabric.so.1" in r["error"]


def test_a_library_that_is_not_a_plugin_is_refused(libs):
    r = probe(NCCL_NET_PLUGIN=os.path.join(libs["stray"], "libnothing.so"),
              LD_LIBRARY_PATH=libs["fabric"])
    assert "exports no ncclNetPlugin_v* symbol" in r["error"]
