"""Process helpers: a free local port for a rendezvous, a torchrun launch on CPU ranks (its
rendezvous port bound by torchrun itself: --standalone), a worker launch that returns the
JSON its rank 0 wrote, and a function spawned on gloo ranks that returns each rank's JSON."""
import atexit
import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from typing import List

from tests.support.paths import ROOT


def free_port() -> int:
    """A port free now. Another process may bind it before the caller does: launches that can
    let their server bind port 0 do (torchrun --standalone, init_method file://); the others
    retry a start that failed with port_taken (PORT_ATTEMPTS times)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT_ATTEMPTS = 3


def port_taken(text: str) -> bool:
    """Whether a failed start's output says its port was bound by someone else first."""
    low = text.lower()
    return "eaddrinuse" in low or "address already in use" in low


@functools.lru_cache(maxsize=None)
def _agent_log_dir() -> str:
    """One folder for this test process's torchrun agents, removed when it exits. Without
    --log-dir each agent makes a torchelastic_* folder in the temporary directory and leaves
    it there (80-odd a run of the suite)."""
    folder = tempfile.mkdtemp(prefix="megatron-tests-agents-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def torchrun_cmd(nproc: int) -> List[str]:
    """The argv that starts torchrun with `nproc` ranks on this machine, the one home of the
    tests' launcher line: --standalone, whose rendezvous store binds port 0 itself (no port
    picked in advance for another process to take first), and the agents' log folder."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", f"--log-dir={_agent_log_dir()}"]


def torchrun(nproc: int, script: str, *args: str, timeout: int = 600, env=None):
    """Launches `script` on `nproc` CPU ranks (gloo) through torchrun; returns CompletedProcess."""
    cmd = [*torchrun_cmd(nproc), script, *args]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=full_env)


def launch_json(nproc: int, script: str, out: str, *args: str, plain_single: bool = False,
                timeout: int = 600):
    """Runs a test worker on `nproc` CPU ranks with `--out out` and `args` (one rank as a plain
    process when `plain_single`, without torchrun's rendezvous), asserts that it exited 0 (the
    failure shows the end of its stderr) and returns what its rank 0 wrote to `out`."""
    argv = ["--out", out, *args]
    if nproc == 1 and plain_single:
        proc = subprocess.run([sys.executable, script, *argv], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1"))
    else:
        proc = torchrun(nproc, script, *argv, timeout=timeout)
    assert proc.returncode == 0, f"{nproc}-rank launch of {os.path.basename(script)} " \
                                 f"{' '.join(args)} failed:\n{proc.stderr[-5000:]}"
    with open(out) as f:
        return json.load(f)


def _joined(rank: int, worker, folder: str, nprocs: int) -> None:
    import torch.distributed as dist
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(nprocs), LOCAL_RANK=str(rank))
    # a file store: no port to pick in advance and lose to another process before it is bound
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(folder, 'store')}",
                            rank=rank, world_size=nprocs)
    result = worker(rank, folder)
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def spawn_json(worker, folder: str, nprocs: int = 2) -> list:
    """Runs `worker(rank, folder)` (a module-level function) on `nprocs` gloo ranks started by
    torch.multiprocessing.spawn and joined through a file store in `folder`; returns what each
    rank's worker returned (JSON), in rank order."""
    import torch.multiprocessing as mp
    mp.spawn(_joined, args=(worker, folder, nprocs), nprocs=nprocs)
    return [json.load(open(os.path.join(folder, f"rank{r}.json"))) for r in range(nprocs)]


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
