"""Launch discovery (env.py, reads only the environment), device/process-group setup
(device.py, imports torch), the network preflight (preflight.py), a torchrun worker's tie to its
agent (lifetime.py) and the Frontier job environment (frontier_env.py, the source of
examples/frontier/env.sh and of the planner's Frontier sbatch). Names resolve lazily so that
reading the launch environment, as the entry points do to validate a config before anything
heavy, does not import torch."""
import importlib

_EXPORTS = {
    "LaunchEnv": "env", "discover": "env", "expand_nodelist": "env",
    "DeviceInfo": "device", "detect_device": "device", "init_distributed": "device",
    "leave_distributed": "device",
    "check_network": "preflight", "follow_launcher": "lifetime",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'megatron.launch' has no attribute {name!r}")
    return getattr(importlib.import_module(f"megatron.launch.{_EXPORTS[name]}"), name)
