"""The only module that knows whether the device is CUDA, ROCm or the CPU."""
from __future__ import annotations

import datetime
import inspect
import logging
import os
import re
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.distributed as dist

from megatron.config import devices
from megatron.launch.env import LaunchEnv
from megatron.launch.lifetime import follow_launcher
from megatron.launch.preflight import check_network

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class DeviceInfo:
    device: torch.device
    vendor: str  # rocm | cuda | cpu
    name: str
    arch: Optional[str]  # gfx90a, sm_90, ... ; None on the CPU
    peak_tflops: Optional[float]

    @property
    def is_gpu(self) -> bool:
        return self.vendor != "cpu"

    @property
    def backend(self) -> str:
        # NCCL on ROCm is RCCL behind the same torch name.
        return "nccl" if self.is_gpu else "gloo"


def lookup_peak(name: str) -> Optional[float]:
    """Dense bf16 TFLOP/s of the named device (config/devices.py), None when unknown."""
    return devices.lookup(devices.PEAK_TFLOPS, name)


def gpu_arch(index: int = 0) -> Optional[str]:
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(index)
    if torch.version.hip:
        return getattr(props, "gcnArchName", "").split(":")[0] or None
    return f"sm_{props.major}{props.minor}"


def torch_toolkit() -> Tuple[str, Optional[str]]:
    """The GPU toolkit this torch was built against: ("rocm", HIP version), ("cuda", CUDA
    version) or ("cpu", None). Fused-kernel builds record the same pair and must match it."""
    if torch.version.hip:
        return "rocm", torch.version.hip
    if torch.version.cuda:
        return "cuda", torch.version.cuda
    return "cpu", None


def detect_device(local_rank: int = 0) -> DeviceInfo:
    if torch.cuda.is_available() and os.environ.get("MEGATRON_FORCE_CPU") != "1":
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        name = torch.cuda.get_device_name(index)
        vendor = "rocm" if torch.version.hip else "cuda"
        return DeviceInfo(torch.device("cuda", index), vendor, name, gpu_arch(index),
                          lookup_peak(name))
    return DeviceInfo(torch.device("cpu"), "cpu", "cpu", None, None)


# torch.distributed.init_process_group hangs with device_id in torch 2.6.x and 2.7.0
# (pytorch/pytorch#153960); DeepSpeed skips the same range.
DEVICE_ID_HANGS = ((2, 6, 0), (2, 7, 1))  # [first, last) torch versions


def _version_tuple(version: str) -> Tuple[int, int, int]:
    """'2.7.0+rocm6.3' -> (2, 7, 0); pre-releases count as their release."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if not match:
        return (0, 0, 0)
    return (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))


def passes_device_id(torch_version: str, accepts_device_id: bool, world_size: int) -> bool:
    """Whether to bind the process group to our device (eager communicator set-up, and new
    groups built by splitting it). init_process_group accepts device_id from torch 2.3; a world
    of one has nobody to split with."""
    first, last = DEVICE_ID_HANGS
    return (accepts_device_id and world_size > 1
            and not first <= _version_tuple(torch_version) < last)


def init_distributed(launch: LaunchEnv, device: DeviceInfo, timeout_s: int = 600) -> None:
    """Joins the process group once; a single process gets a world of one (gloo on CPU).

    Before joining: the network preflight (preflight.py: a multi-node GPU job whose network
    plugin or libfabric cannot be loaded stops here with one message), and under torchrun the
    request to be signalled if the agent dies (lifetime.py). `timeout_s` bounds the rendezvous
    and every collective (config: parallel.timeout_minutes)."""
    if dist.is_initialized():
        return
    check_network(launch, device.vendor)
    follow_launcher(launch)
    os.environ.setdefault("MASTER_ADDR", launch.master_addr)
    os.environ.setdefault("MASTER_PORT", str(launch.master_port))
    # DeepSpeed reads these to find its place in the job when it wraps our process group.
    for key, value in (("RANK", launch.rank), ("WORLD_SIZE", launch.world_size),
                       ("LOCAL_RANK", launch.local_rank)):
        os.environ.setdefault(key, str(value))
    where = "in-memory store" if launch.world_size == 1 else \
        f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    log.info("joining %s process group: rank %d of %d via %s (%s, %d node(s), timeout %d s)",
             device.backend, launch.rank, launch.world_size, where, launch.source,
             launch.num_nodes, timeout_s)
    kwargs = {}
    accepts = "device_id" in inspect.signature(dist.init_process_group).parameters
    if device.is_gpu and passes_device_id(torch.__version__, accepts, launch.world_size):
        kwargs["device_id"] = device.device
    if launch.world_size == 1:
        # A world of one has no peer to meet: an in-memory store instead of a TCP rendezvous on
        # MASTER_PORT, which a second single-process run on the same machine would find taken.
        kwargs["store"] = dist.HashStore()
    dist.init_process_group(device.backend, rank=launch.rank, world_size=launch.world_size,
                            timeout=datetime.timedelta(seconds=timeout_s), **kwargs)


def leave_distributed() -> None:
    """Leaves the process group init_distributed joined, before the interpreter exits: left to
    exit-time destructors, a gloo rank can abort ("terminate called without an active
    exception") after a run that succeeded, and the launcher then reports a failure. The group
    is joined once per process (a process may train several runs in it), so the one who ends the
    process leaves it."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
