"""A torchrun worker must not outlive its agent.

torchrun's agent handles SIGTERM, SIGINT, SIGHUP and SIGQUIT by forwarding them to the workers
(then it waits a shutdown timeout, 30 s unless told otherwise, kills what is left, and exits 1
with a traceback). Any other signal takes its default action on the agent alone: SIGUSR1, the
signal `#SBATCH --signal=B:USR1@...` or `scancel -s USR1 --batch` sends to a batch script's
torchrun, kills the agent and leaves its workers training on as orphans, which are then killed
at the time limit without a checkpoint. Asking the kernel for a parent-death signal turns the
agent's death into SIGTERM in every worker, which the training loop handles like Slurm's
warning: checkpoint at the next step boundary and stop.

Not armed under srun (the task's parent is slurmstepd, which Slurm signals and cleans up
itself) nor for a lone process."""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from typing import Mapping, Optional

from megatron.launch.env import LaunchEnv

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <sys/prctl.h>


def follow_launcher(launch: LaunchEnv, env: Optional[Mapping[str, str]] = None,
                    sig: int = signal.SIGTERM) -> bool:
    """Under torchrun, have the kernel send `sig` to this process when its agent dies. Returns
    whether the request is in place."""
    env = os.environ if env is None else env
    # torchrun's agent sets TORCHELASTIC_RUN_ID for its workers; RANK/WORLD_SIZE alone may come
    # from another launcher whose processes are not our parent.
    if launch.source != "torchrun" or "TORCHELASTIC_RUN_ID" not in env:
        return False
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        log.warning("could not ask for a signal on torchrun's exit (prctl errno %d): a worker "
                    "may outlive a killed torchrun agent", ctypes.get_errno())
        return False
    if os.getppid() != parent:
        # The agent died between the two calls: the kernel will not send the signal now.
        os.kill(os.getpid(), sig)
    return True
