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
