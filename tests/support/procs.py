"""Process helpers: a free local port for a rendezvous, and a torchrun launch on CPU ranks."""
import os
import socket
import subprocess
import sys

from tests.support.paths import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, script: str, *args: str, timeout: int = 600, env=None):
    """Launches `script` on `nproc` CPU ranks (gloo) through torchrun; returns CompletedProcess."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           f"--master_port={free_port()}", script, *args]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=full_env)


def pid_of(*in_cmdline: str, env_has: str):
    """The pid of a process whose command line holds every string of `in_cmdline` and whose
    environment holds the entry `env_has` ("RANK=1", "SLURM_PROCID=1"), or None. The fault tests
    use it to stop or kill one rank of a job from outside, as a failing machine would."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if all(part in cmd for part in in_cmdline) and env_has in env:
            return int(pid)
    return None
