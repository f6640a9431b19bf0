"""Where this process sits in the job: torchrun, a bare srun task, or a lone process.

Nothing here talks to the network; it only reads the environment. Slurm support needs no
scontrol, ssh or mpi4py: the rendezvous is derived from SLURM_* variables alone, and from the
step's variables first: a step may run on part of its allocation (a bad node excluded with
`srun -x`, two steps side by side, debugging in an salloc), and the job's first node is then
not among the step's nodes, so nobody would listen on the master address."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import List, Mapping, Optional

from megatron.config.errors import InputError, ascii_digits

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class LaunchEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str  # torchrun | slurm | single
    num_nodes: int = 1  # nodes this launch spans (the step's under Slurm)

    @property
    def ranks_per_node(self) -> int:
        """Ranks on the busiest node (the ranks spread evenly, the first nodes one more)."""
        return max(1, -(-self.world_size // max(1, self.num_nodes)))


# Most specific first: srun sets the step's list in every task; the job's list (SLURM_NODELIST
# is its old name) names nodes a step on part of the allocation does not use.
NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
NUM_NODES_VARS = ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")


def _expand_range(prefix: str, body: str, var: str) -> List[str]:
    hosts = []
    for part in body.split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            if not (ascii_digits(lo) and ascii_digits(hi)) or int(hi) < int(lo):
                raise InputError(f"{var} range {part!r} is malformed; expected "
                                 "LOW-HIGH with LOW <= HIGH, as in frontier[00012-00013]")
            width = len(lo)
            hosts += [f"{prefix}{i:0{width}d}" for i in range(int(lo), int(hi) + 1)]
        else:
            hosts.append(prefix + part)
    return hosts


def expand_nodelist(nodelist: str, var: str = "SLURM_JOB_NODELIST") -> List[str]:
    """'frontier[00012-00013,00020],login1' -> ['frontier00012', 'frontier00013', ...]; `var`
    names the variable the list came from in error messages."""
    hosts: List[str] = []
    for match in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?([^,]*)", nodelist):
        prefix, body, suffix = match.group(1), match.group(2), match.group(3)
        if body is None:
            hosts.append(prefix + suffix)
        else:
            hosts += [h + suffix for h in _expand_range(prefix, body, var)]
    if not hosts:
        raise InputError(f"{var}={nodelist!r} names no host")
    for host in hosts:
        if "[" in host or "]" in host:
            raise InputError(f"{var}={nodelist!r} is malformed near {host!r}: "
                             "expected hosts like frontier[00012-00013,00020],login1")
    return hosts


def _int(env: Mapping[str, str], name: str) -> int:
    value = env[name]
    try:
        return int(value)
    except ValueError:
        raise InputError(f"environment variable {name}={value!r} is not an integer; "
                         "it is set by the launcher, so check the launch command") from None


def _port(env: Mapping[str, str], job_id: Optional[str], step_id: Optional[str] = None) -> int:
    if "MASTER_PORT" in env:
        port = _int(env, "MASTER_PORT")
        if not 0 < port < 65536:
            raise InputError(f"environment variable MASTER_PORT={port} is not a TCP port; "
                             "expected 1-65535")
        return port
    if job_id and ascii_digits(job_id):
        # Spread concurrent jobs sharing a first node over 10000 ports above 20000, and the
        # steps of one job too: two steps running side by side may share their first node.
        step = int(step_id) if step_id and ascii_digits(step_id) else 0
        return 20000 + (int(job_id) + step) % 10000
    return DEFAULT_PORT


def _first(env: Mapping[str, str], names) -> Optional[str]:
    return next((name for name in names if env.get(name)), None)


def _slurm_master(env: Mapping[str, str]) -> str:
    if env.get("MASTER_ADDR"):
        return env["MASTER_ADDR"]
    var = _first(env, NODELIST_VARS)
    return expand_nodelist(env[var], var)[0] if var else "127.0.0.1"


def _torchrun_nodes(env: Mapping[str, str], world: int) -> int:
    """torchrun's agents, one per node: GROUP_WORLD_SIZE, else world / ranks per node."""
    if "GROUP_WORLD_SIZE" in env:
        return _int(env, "GROUP_WORLD_SIZE")
    if "LOCAL_WORLD_SIZE" in env:
        local = _int(env, "LOCAL_WORLD_SIZE")
        return max(1, world // local) if local > 0 else 1
    return 1


def discover(env: Optional[Mapping[str, str]] = None) -> LaunchEnv:
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _int(env, "WORLD_SIZE")
        return LaunchEnv(_int(env, "RANK"), world,
                         _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
                         env.get("MASTER_ADDR", "127.0.0.1"), _port(env, None), "torchrun",
                         _torchrun_nodes(env, world))
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        nodes_var = _first(env, NUM_NODES_VARS)
        return LaunchEnv(_int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS"),
                         _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
                         _slurm_master(env),
                         _port(env, env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID")), "slurm",
                         _int(env, nodes_var) if nodes_var else 1)
    return LaunchEnv(0, 1, 0, env.get("MASTER_ADDR", "127.0.0.1"), _port(env, None), "single")
