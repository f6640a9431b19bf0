"""Start-up check of the collective library's network plugin, before any rank joins a group.

RCCL (and NCCL) reach libfabric networks such as HPE Slingshot only through a network plugin
(aws-ofi-rccl / aws-ofi-nccl) that they dlopen when the first communicator is built. When the
plugin or libfabric cannot be loaded, RCCL falls back to TCP sockets without a word, several
times slower between nodes; with NCCL_NET=OFI it fails instead, but only at the first
collective, after the model is built, in a traceback from every rank. This check loads the same
libraries the same way (dlopen through the process's library path) within a second of start-up
and turns a failure into one message that says what to fix.

When it runs: a GPU process in a job of more than one rank whose environment asks for the
plugin (NCCL_NET names it, or NCCL_NET_PLUGIN is set), and a multi-node GPU job on a Slingshot
node (/dev/cxi0 present) whatever the environment says, unless NCCL_NET names another transport
on purpose (NCCL_NET=Socket, IB). MEGATRON_NET_PREFLIGHT=off skips it, =always also runs it
without a GPU (to check a job script on CPU nodes)."""
from __future__ import annotations

import ctypes
import glob
import logging
import os
from dataclasses import dataclass
from typing import List, Mapping, Optional

from megatron.config.errors import InputError
from megatron.launch.env import LaunchEnv

log = logging.getLogger(__name__)

# NCCL_NET values that select the libfabric plugin. The plugin calls itself "AWS Libfabric" in
# older releases and "Libfabric" in newer ones, and newer ones also answer to "OFI", the value
# OLCF recommends (pytorch_frontier.rst, "Manual RCCL Network Plugin Configuration").
PLUGIN_NETS = ("ofi", "aws libfabric", "libfabric")
LIBFABRIC = "libfabric.so.1"
# Slingshot 11 NICs appear as /dev/cxi<N> on the node.
SLINGSHOT_DEVICES = "/dev/cxi*"
MODES = ("auto", "off", "always")


@dataclass(frozen=True)
class NetCheck:
    """What the check found: the plugin file it loaded (None when it did not run)."""
    ran: bool
    plugin: Optional[str] = None
    reason: str = ""


def _plugin_names(vendor: str, requested: Optional[str]) -> List[str]:
    """File names RCCL/NCCL try, in their order. NCCL_NET_PLUGIN is a path, a file name, or a
    suffix (NCCL_NET_PLUGIN=ofi -> libnccl-net-ofi.so); without it RCCL looks for
    librccl-net.so and, in some versions, libnccl-net.so (HPE rccl_tuning_guide.md,
    "Troubleshooting Steps")."""
    prefixes = ("librccl-net", "libnccl-net") if vendor != "cuda" else ("libnccl-net",)
    if not requested:
        return [f"{p}.so" for p in prefixes]
    if "/" in requested or requested.endswith(".so"):
        return [requested]
    return [requested] + [f"{p}-{requested}.so" for p in prefixes]


def _library_path(env: Mapping[str, str]) -> List[str]:
    return [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]


def _resolve(name: str, env: Mapping[str, str]) -> str:
    """A bare file name found on LD_LIBRARY_PATH becomes its path, so that the error can name
    where it was found; otherwise dlopen's own search (the loader cache, RUNPATH) applies."""
    if "/" in name:
        return name
    for directory in _library_path(env):
        candidate = os.path.join(directory, name)
        if os.path.exists(candidate):
            return candidate
    return name


def _dlopen(path: str) -> ctypes.CDLL:
    # RTLD_NOW (ctypes adds it) resolves every symbol now, as RCCL's dlopen will: a plugin whose
    # libfabric is missing or too old fails here rather than at the first collective.
    return ctypes.CDLL(path, mode=os.RTLD_LOCAL)


def _is_net_plugin(lib: ctypes.CDLL) -> bool:
    for version in range(2, 16):
        try:
            getattr(lib, f"ncclNetPlugin_v{version}")
            return True
        except AttributeError:
            continue
    return False


def _mode(env: Mapping[str, str]) -> str:
    mode = env.get("MEGATRON_NET_PREFLIGHT", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise InputError(f"environment variable MEGATRON_NET_PREFLIGHT={mode!r} is invalid: "
                         f"expected one of {', '.join(MODES)}")
    return mode


def _why_required(launch: LaunchEnv, gpu: bool, env: Mapping[str, str],
                  slingshot: bool) -> str:
    """Why this job needs the plugin, or "" when it does not."""
    net = env.get("NCCL_NET", "").strip().lower()
    plugin = env.get("NCCL_NET_PLUGIN", "").strip()
    if launch.world_size == 1 or not gpu:
        return ""
    if net in PLUGIN_NETS:
        return f"NCCL_NET={env['NCCL_NET']} asks for the libfabric network plugin"
    if net:
        return ""  # another transport, chosen on purpose
    if plugin and plugin.lower() != "none":
        return f"NCCL_NET_PLUGIN={plugin} asks for a network plugin"
    if launch.num_nodes > 1 and slingshot:
        return (f"this job spans {launch.num_nodes} nodes with Slingshot NICs, which RCCL reaches "
                "only through the libfabric plugin (otherwise: TCP sockets, silently)")
    return ""


SOCKETS_ON_PURPOSE = "to run over TCP sockets on purpose set NCCL_NET=Socket"


def _fix(vendor: str) -> str:
    lib = "librccl-net.so" if vendor != "cuda" else "libnccl-net.so"
    return ("fix: on Frontier source examples/frontier/env.sh (it loads the rccl-net-plugin "
            "module, or uses your own build when AWS_OFI_RCCL_DIR names its prefix), or set "
            f"NCCL_NET_PLUGIN=/path/to/lib/{lib} or put its lib directory on LD_LIBRARY_PATH; "
            + SOCKETS_ON_PURPOSE)


def _load_libfabric(env: Mapping[str, str], why: str) -> None:
    try:
        _dlopen(_resolve(LIBFABRIC, env))
    except OSError as e:
        raise InputError(f"network preflight: {why}, but libfabric cannot be loaded ({e}); "
                         "the network plugin needs it. Fix: load the libfabric module (on "
                         "Frontier it is in the default environment: `module load libfabric`) "
                         "or put its lib64 directory on LD_LIBRARY_PATH; "
                         + SOCKETS_ON_PURPOSE) from None


def _load_plugin(env: Mapping[str, str], why: str, vendor: str) -> str:
    requested = env.get("NCCL_NET_PLUGIN", "").strip()
    errors = []
    for name in _plugin_names(vendor, requested or None):
        path = _resolve(name, env)
        try:
            lib = _dlopen(path)
        except OSError as e:
            errors.append(str(e))
            continue
        if not _is_net_plugin(lib):
            raise InputError(f"network preflight: {path} loads but exports no ncclNetPlugin_v* "
                             f"symbol, so it is not a network plugin; {_fix(vendor)}")
        return path
    searched = ":".join(_library_path(env)) or "(empty)"
    raise InputError(f"network preflight: {why}, but no network plugin can be loaded "
                     f"(tried {', '.join(_plugin_names(vendor, requested or None))}; "
                     f"LD_LIBRARY_PATH={searched}; {errors[-1]}). Without it RCCL would fall "
                     f"back to TCP sockets or fail at its first collective; {_fix(vendor)}")


def check_network(launch: LaunchEnv, vendor: str, env: Optional[Mapping[str, str]] = None,
                  slingshot: Optional[bool] = None) -> NetCheck:
    """Raises InputError, one message, when the job needs the network plugin and it or
    libfabric cannot be loaded. `vendor` is DeviceInfo.vendor (rocm | cuda | cpu)."""
    env = os.environ if env is None else env
    mode = _mode(env)
    if mode == "off":
        return NetCheck(False, reason="MEGATRON_NET_PREFLIGHT=off")
    if slingshot is None:
        slingshot = bool(glob.glob(SLINGSHOT_DEVICES))
    gpu = vendor != "cpu" or mode == "always"
    why = _why_required(launch, gpu, env, slingshot)
    if not why:
        _warn_unguarded(launch, vendor, env)
        return NetCheck(False, reason="no network plugin needed")
    if env.get("NCCL_NET_PLUGIN", "").strip().lower() == "none":
        raise InputError(f"network preflight: {why}, but NCCL_NET_PLUGIN=none disables every "
                         f"network plugin; unset NCCL_NET_PLUGIN, or {SOCKETS_ON_PURPOSE}")
    _load_libfabric(env, why)
    path = _load_plugin(env, why, vendor)
    if env.get("FI_MR_CACHE_MONITOR", "").lower() == "memhooks":
        # OLCF pytorch_frontier.rst, "Manual RCCL Network Plugin Configuration".
        log.warning("FI_MR_CACHE_MONITOR=memhooks can deadlock the RCCL network plugin; use "
                    "kdreg2 (Frontier's default) or userfaultfd")
    if launch.rank == 0:
        log.info("network preflight: %s; plugin %s and libfabric load", why, path)
    return NetCheck(True, path, why)


def _warn_unguarded(launch: LaunchEnv, vendor: str, env: Mapping[str, str]) -> None:
    if vendor == "rocm" and launch.num_nodes > 1 and not env.get("NCCL_NET") and launch.rank == 0:
        log.warning("multi-node RCCL run without NCCL_NET: if the network plugin does not load "
                    "RCCL uses TCP sockets without saying so; set NCCL_NET=OFI (Slingshot) to "
                    "make that an error")
