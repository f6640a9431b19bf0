"""The only module that knows whether the device is CUDA, ROCm or the CPU."""
from __future__ import annotations

import dataclasses
import datetime
import functools
import gc
import inspect
import logging
import os
import re
import socket
import threading
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import torch.distributed as dist

from megatron.config import devices
from megatron.config.errors import InputError
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
    # Its functions take `group=group.WORLD` as a default argument, bound at import: imported
    # after the join (by DeepSpeed, or the MoE exchange), they would hold the world group past
    # destroy_process_group, and its gloo threads would live into interpreter exit.
    import torch.distributed.nn.functional  # noqa: F401
    kwargs = {}
    accepts = "device_id" in inspect.signature(dist.init_process_group).parameters
    if device.is_gpu and passes_device_id(torch.__version__, accepts, launch.world_size):
        kwargs["device_id"] = device.device
    if launch.world_size == 1:
        # A world of one has no peer to meet: an in-memory store instead of a TCP rendezvous on
        # MASTER_PORT, which a second single-process run on the same machine would find taken.
        kwargs["store"] = dist.HashStore()
    join = functools.partial(dist.init_process_group, device.backend, rank=launch.rank,
                             world_size=launch.world_size,
                             timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    if launch.world_size == 1:
        join()
        return
    if device.is_gpu:  # the current device is per thread: the joining thread's must be ours
        join = functools.partial(_on_device, device.device, join)
    # the address and port torch reads, which the environment may have set before us
    _join_within(join, dataclasses.replace(
        launch, master_addr=os.environ["MASTER_ADDR"],
        master_port=int(os.environ["MASTER_PORT"])), timeout_s)


def _on_device(device: torch.device, join) -> None:
    if torch.cuda.is_available():  # (tests pass a GPU's DeviceInfo on a CPU-only build)
        torch.cuda.set_device(device)
    join()


def rendezvous_deadline(timeout_s: float) -> float:
    """How long a rank may take to join: the rendezvous timeout and a tenth of it (at least
    10 s), for torch's own retry delays and the gloo/NCCL connections made after the store."""
    return timeout_s + max(10.0, timeout_s / 10)


def _join_within(join, launch: LaunchEnv, timeout_s: float) -> None:
    """Runs `join` (init_process_group) in a helper thread and gives it rendezvous_deadline().

    torch bounds the client's connect by the timeout, but not the handshake after it: a client
    whose MASTER_PORT is held by another program (a listener that never speaks the c10d
    protocol) waits in TCPStore::ping()'s recv forever (torch 2.13, with or without libuv).
    The thread is left blocked there; the caller gets one InputError and the process may end."""
    failure: list = []

    def run():
        try:
            join()
        except BaseException as e:  # handed to the caller's thread below
            failure.append(e)

    thread = threading.Thread(target=run, name="rendezvous", daemon=True)
    thread.start()
    deadline = rendezvous_deadline(timeout_s)
    thread.join(deadline)
    if thread.is_alive():
        raise InputError(_unanswered(launch, deadline))
    if failure and isinstance(failure[0], dist.DistError):
        raise InputError(_rendezvous_failed(launch, failure[0], timeout_s)) from failure[0]
    if failure:
        raise failure[0]


def _where(launch: LaunchEnv) -> str:
    return f"{launch.master_addr}:{launch.master_port}"


def _fix(launch: LaunchEnv) -> str:
    return (f"set another MASTER_PORT for every rank (export MASTER_PORT=...; under Slurm it is "
            f"derived from the job id unless set), or check node {launch.master_addr}: what "
            f"holds port {launch.master_port} (ss -ltnp) and whether rank 0 started there")


def _listening(launch: LaunchEnv) -> bool:
    """Whether anything accepts TCP connections on the master's address and port."""
    try:
        with socket.create_connection((launch.master_addr, launch.master_port), timeout=2):
            return True
    except OSError:
        return False


def _unanswered(launch: LaunchEnv, waited: float) -> str:
    what = ("something accepts connections there but does not answer torch's rendezvous: the "
            "port is held by another program" if _listening(launch) else
            "nobody answered the rendezvous")
    return (f"rank {launch.rank} of {launch.world_size} could not join the process group at "
            f"{_where(launch)} within {waited:.0f} s (parallel.timeout_minutes and a margin): "
            f"{what}; {_fix(launch)}")


def _rendezvous_failed(launch: LaunchEnv, error: BaseException, timeout_s: float) -> str:
    said = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if "EADDRINUSE" in said or "address already in use" in said:
        what = "the port is held by another program (address already in use)"
    elif launch.rank == 0:
        what = f"not every rank arrived within {timeout_s:.0f} s (parallel.timeout_minutes)"
    else:
        what = (f"nobody answered within {timeout_s:.0f} s (parallel.timeout_minutes): rank 0 "
                f"did not open the rendezvous there (it failed, or MASTER_ADDR names another node)")
    return (f"rank {launch.rank} of {launch.world_size} could not join the process group at "
            f"{_where(launch)}: {what} (torch: {said}); {_fix(launch)}")


def leave_distributed() -> None:
    """Leaves the process group init_distributed joined, before the interpreter exits: left to
    exit-time destructors, a gloo rank can abort ("terminate called without an active
    exception") after a run that succeeded, and the launcher then reports a failure. The group
    is joined once per process (a process may train several runs in it), so the one who ends the
    process leaves it."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        # The groups' objects go now, while the interpreter is whole: each gloo group joins its
        # threads in its destructor. A group still held (by a model or engine not closed) keeps
        # them running into interpreter exit, where their teardown races the process's own and
        # a finished rank could abort ("terminate called without an active exception").
        # Unfrozen first: the world group is older than a later job's gc.freeze (startup.start).
        gc.unfreeze()
        gc.collect()
