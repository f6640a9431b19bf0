"""How the torchrun workers of the tests end: leave the process group, then exit."""
from __future__ import annotations

import sys
from typing import Callable, NoReturn

from megatron.launch.device import leave_distributed


def exit_after(main: Callable[[], int]) -> NoReturn:
    """Run a worker's main and exit with its status, after leaving the process group as
    megatron-train does: left to exit-time destructors, a gloo rank can abort after a run that
    succeeded ("terminate called without an active exception"); CI saw it in these workers."""
    code = main()
    leave_distributed()
    sys.exit(code)
