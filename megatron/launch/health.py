"""A node checked before it trains: each rank, before it joins the process group, runs a few
seconds of checks on its own device and node, so a faulty GPU or node ends the job at start-up
with its name instead of hanging a rendezvous, diverging an hour later or slowing every step.

    devices   a GPU rank sees at least as many GPUs as its node has ranks
    GEMM      a seeded 512 x 512 matrix product on the device matches its float64 reference
    memory    most of the device's memory is free (another process holding it would not be)
    command   MEGATRON_HEALTH_CHECK, when set: a shell command run on the rank's node; a
              non-zero exit fails the node (site checks, and tests)
    link      after the rendezvous, the ranks of each node all-reduce COLLECTIVE_MB among
              themselves; slower than MEGATRON_HEALTH_MIN_GBPS (default MIN_GBPS: far below a
              working link, so only a broken or degraded one fails) fails the node

The node is named as Slurm names it (SLURMD_NODENAME), else by its host name. What fails raises
config.errors.BadNode (exit 5); the job chain then leaves the node out of the next job
(training/chain.py, <run.dir>/bad_nodes)."""
from __future__ import annotations

import os
import socket
import subprocess
import time
from typing import Dict, List, Mapping

import torch
import torch.distributed as dist

from megatron.config.errors import InputError, ascii_float

HEALTH_COMMAND = "MEGATRON_HEALTH_CHECK"
GEMM_N = 512
# fp32 GEMMs may run as TF32 on NVIDIA GPUs (10-bit mantissa): a relative error well below 1e-2
# is arithmetic; a faulty unit is off by far more.
GEMM_TOLERANCE = 1e-2
MIN_FREE = 0.5  # of the device's memory
COLLECTIVE_MB = 16
# The slowest node-local all-reduce (algorithm bandwidth: bytes over seconds) taken for a working
# link: xGMI/NVLink give tens to hundreds of GB/s, shared memory on a CPU node about 1; a link
# that fell back to the network or a degraded one is an order of magnitude or more below.
MIN_GBPS = {"cuda": 5.0, "cpu": 0.01}
MIN_GBPS_ENV = "MEGATRON_HEALTH_MIN_GBPS"


def min_gbps(environ: Mapping[str, str], device_type: str) -> float:
    """The link floor: MEGATRON_HEALTH_MIN_GBPS when set (a finite number >= 0 in ASCII digits;
    'abc' was a ValueError traceback on every rank), else the device kind's default."""
    text = environ.get(MIN_GBPS_ENV)
    if not text:
        return MIN_GBPS.get(device_type, MIN_GBPS["cuda"])
    try:
        value = ascii_float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < float("inf"):
        raise InputError(f"environment variable {MIN_GBPS_ENV}={text!r} is invalid: expected "
                         f"the slowest node-local all-reduce taken for a working link, in GB/s "
                         f"(a number >= 0; default {MIN_GBPS.get(device_type, 5.0):g} here); "
                         f"set it to a number or unset it")
    return value


def node_name(environ: Mapping[str, str]) -> str:
    return environ.get("SLURMD_NODENAME") or socket.gethostname()


def check_node(device: torch.device, local_ranks: int, environ: Mapping[str, str]) -> List[str]:
    """What is wrong with this rank's node, one line each; [] when it is healthy."""
    min_gbps(environ, device.type)  # a bad link floor is refused here, before the job forms
    problems = []
    if device.type == "cuda":
        seen = torch.cuda.device_count()
        if seen < local_ranks:
            problems.append(f"{seen} GPU(s) visible for {local_ranks} rank(s) on the node")
        free, total = torch.cuda.mem_get_info(device)
        if free < MIN_FREE * total:
            problems.append(f"only {free / 2**30:.1f} of {total / 2**30:.1f} GiB of GPU memory "
                            "free: another process holds it")
    problems += _gemm(device)
    command = environ.get(HEALTH_COMMAND, "").strip()
    if command:
        problems += _command(command)
    return problems


def _gemm(device: torch.device) -> List[str]:
    gen = torch.Generator().manual_seed(1234)
    a = torch.randn(GEMM_N, GEMM_N, generator=gen, dtype=torch.float64, device="cpu")
    b = torch.randn(GEMM_N, GEMM_N, generator=gen, dtype=torch.float64, device="cpu")
    got = (a.float().to(device) @ b.float().to(device)).double().cpu()
    want = a @ b
    error = float((got - want).abs().max() / want.abs().max())
    if not error < GEMM_TOLERANCE:  # also catches NaN
        return [f"a {GEMM_N}x{GEMM_N} GEMM on {device} is off its float64 reference by "
                f"{error:.3g} (relative; at most {GEMM_TOLERANCE} expected)"]
    return []


def _command(command: str) -> List[str]:
    try:
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return [f"the health check {HEALTH_COMMAND}={command!r} did not finish in 120 s"]
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        return [f"the health check {HEALTH_COMMAND}={command!r} exited {done.returncode}"
                + (f": {said[0]}" if said[0] else "")]
    return []


def ranks_by_node(nodes: List[str]) -> Dict[str, List[int]]:
    """Each node's ranks, in rank order, from start-up's roster (every rank's node)."""
    by: Dict[str, List[int]] = {}
    for rank, node in enumerate(nodes):
        by.setdefault(node, []).append(rank)
    return by


def check_node_link(nodes: List[str], rank: int, device: torch.device,
                    environ: Mapping[str, str] = os.environ) -> List[str]:
    """Collective over the whole job (every rank calls it): the ranks of each node all-reduce
    COLLECTIVE_MB among themselves, timed after a warm-up; what is wrong with this rank's node's
    link, [] when it is healthy (or the rank is alone on its node)."""
    by = ranks_by_node(nodes)
    if len(by) == 1:
        return _node_link(by[nodes[rank]], None, device, environ)  # the world is the node
    # each node's group ends with the check: a process that trains several runs would keep
    # one per run (communicators, buffers and threads) until it ended
    group, _ = dist.new_subgroups_by_enumeration(list(by.values()))
    try:
        return _node_link(by[nodes[rank]], group, device, environ)
    finally:
        dist.destroy_process_group(group)


def _node_link(mine: List[int], group, device: torch.device,
               environ: Mapping[str, str]) -> List[str]:
    """check_node_link's measurement among the node's ranks `mine` (their `group`)."""
    if len(mine) == 1:
        return []
    floor = min_gbps(environ, device.type)
    buf = torch.ones(COLLECTIVE_MB * 2**20 // 4, device=device)
    dist.all_reduce(buf[:1024], group=group)  # connections and communicators
    seconds = min(_timed_all_reduce(buf, group, device) for _ in range(2))  # a hiccup is not
    gbps = buf.numel() * 4 / seconds / 1e9                                  # a broken link
    if gbps < floor:
        return [f"an all-reduce of {COLLECTIVE_MB} MiB among the node's {len(mine)} ranks took "
                f"{seconds:.3f} s ({gbps:.3g} GB/s; at least {floor:g} GB/s expected, "
                f"{MIN_GBPS_ENV}): a broken or degraded link between its devices"]
    return []


def _timed_all_reduce(buf: torch.Tensor, group, device: torch.device) -> float:
    dist.barrier(group=group)
    _sync(device)
    t0 = time.perf_counter()
    dist.all_reduce(buf, group=group)
    _sync(device)
    return time.perf_counter() - t0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
