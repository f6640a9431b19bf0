from megatron.launch.env import LaunchEnv, discover, expand_nodelist
from megatron.launch.device import DeviceInfo, detect_device, init_distributed

__all__ = ["LaunchEnv", "discover", "expand_nodelist", "DeviceInfo", "detect_device",
           "init_distributed"]
