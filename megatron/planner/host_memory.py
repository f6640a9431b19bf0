"""The host memory a CPU rank may use: the smallest of every limit the job runs under.

MemAvailable alone is the machine's view; a job usually runs under tighter limits that the
kernel enforces with the OOM killer and no message (issue 41 item 3: 4.08 GB predicted against
22.7 GB available, the job's 2 GB --mem then killed it). Each limit is read as what is still
free under it, so the interpreter and torch, already resident, are outside it as they are
outside the prediction (planner/fit.py):
- the memory cgroup of this process and of every ancestor (Slurm's --mem, a container's limit):
  cgroup v2 memory.max less memory.current, v1 memory.limit_in_bytes less memory.usage_in_bytes,
  page cache the kernel can drop (inactive_file) counted as free; shared by the ranks on the node;
- RLIMIT_AS less this process's address space (VmSize): per process, not shared.
Every function takes `root` so that tests give it a fake /proc and /sys tree; none imports torch."""
from __future__ import annotations

import os
import resource
from typing import List, Optional, Tuple

from megatron.planner.fit import DeviceMemory, cpu_memory
from megatron.planner.memory import GIB

# cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit value; anything above a
# petabyte is no limit on any machine this runs on.
NO_LIMIT = 2 ** 50


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _number(text: Optional[str]) -> Optional[float]:
    """A cgroup file's number; None for "max", an unreadable file or no limit."""
    if text is None or text.strip() in ("", "max"):
        return None
    try:
        value = float(text.split()[0])
    except ValueError:
        return None
    return value if value < NO_LIMIT else None


def _stat(text: Optional[str], key: str) -> float:
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return float(value)
    return 0.0


def cgroup_dirs(root: str = "/") -> List[Tuple[str, str, str, str]]:
    """(directory, limit file, usage file, reclaimable key of memory.stat) of this process's
    memory cgroup and each ancestor up to the mount's root, innermost first: v2's unified
    hierarchy ("0::/path") at /sys/fs/cgroup (or /sys/fs/cgroup/unified on hybrid systems),
    v1's memory controller ("N:...memory...:/path") at /sys/fs/cgroup/memory."""
    dirs = []
    for line in (_read(os.path.join(root, "proc/self/cgroup")) or "").splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hier == "0" and controllers == "":
            mounts = ("sys/fs/cgroup", "sys/fs/cgroup/unified")
            files = ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            mounts = ("sys/fs/cgroup/memory",)
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        for mount in mounts:
            parts = [p for p in path.strip().split("/") if p]
            for depth in range(len(parts), -1, -1):
                dirs.append((os.path.join(root, mount, *parts[:depth]), *files))
    return dirs


def cgroup_memory(ranks_per_node: int, root: str = "/") -> Optional[DeviceMemory]:
    """The tightest memory cgroup's free memory per rank; None where no cgroup limits memory."""
    best = None
    ranks = max(1, ranks_per_node)
    for directory, limit_file, usage_file, reclaimable in cgroup_dirs(root):
        limit = _number(_read(os.path.join(directory, limit_file)))
        if limit is None:
            continue
        used = _number(_read(os.path.join(directory, usage_file))) or 0.0
        used -= _stat(_read(os.path.join(directory, "memory.stat")), reclaimable)
        free = max(0.0, limit - max(0.0, used))
        if best is None or free / ranks < best.bytes_per_rank:
            source = (f"cgroup {os.path.join(directory, limit_file)} = {limit / GIB:.2f} GB, "
                      f"{free / GIB:.2f} GB of it free / {ranks} "
                      f"rank{'s' if ranks > 1 else ''} on this node")
            best = DeviceMemory("cpu", free / ranks, source)
    return best


def rlimit_memory(root: str = "/", limit: Optional[int] = None) -> Optional[DeviceMemory]:
    """What RLIMIT_AS leaves this process (the limit less its VmSize); None without a limit.
    `limit` stands in for getrlimit in tests."""
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY or limit < 0:
        return None
    status = _read(os.path.join(root, "proc/self/status")) or ""
    vm_kib = next((float(line.split()[1]) for line in status.splitlines()
                   if line.startswith("VmSize:")), 0.0)
    free = max(0.0, limit - vm_kib * 1024)
    return DeviceMemory("cpu", free, f"RLIMIT_AS (ulimit -v) = {limit / GIB:.2f} GB, "
                                     f"{free / GIB:.2f} GB of it free for this process")


def host_memory(ranks_per_node: int, root: str = "/",
                rlimit: Optional[int] = None) -> Optional[DeviceMemory]:
    """This rank's share of host memory: the smallest of MemAvailable per rank, the memory
    cgroups' and RLIMIT_AS's; None where none can be read (not Linux, no limit)."""
    meminfo = _read(os.path.join(root, "proc/meminfo"))
    found = [cpu_memory(meminfo, ranks_per_node) if meminfo else None,
             cgroup_memory(ranks_per_node, root), rlimit_memory(root, rlimit)]
    found = [m for m in found if m is not None]
    return min(found, key=lambda m: m.bytes_per_rank) if found else None
