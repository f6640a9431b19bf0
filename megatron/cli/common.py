"""Shared pieces of the console entry points: logging setup and turning bad input into one clear
message and a non-zero exit instead of a traceback."""
from __future__ import annotations

import functools
import logging
import os
import sys

from megatron.config.errors import ConfigError, Diverged, InputError


def setup_logging(rank: int = 0) -> None:
    level = logging.INFO if rank == 0 else logging.WARNING
    logging.basicConfig(level=level, format=f"[rank{rank}] %(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")


def env_rank() -> int:
    for key in ("RANK", "SLURM_PROCID"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


def friendly_errors(fn):
    """ConfigError / InputError -> 'error: <message>' on stderr and exit code 2; a run that
    stopped itself on divergence (Diverged) -> the same, exit code 3."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ConfigError, InputError, Diverged) as e:
            code = 3 if isinstance(e, Diverged) else 2
            sys.stderr.write(f"error: {e}\n")
            sys.stderr.flush()
            os._exit(code) if _distributed_started() else sys.exit(code)
    return wrapper


def _distributed_started() -> bool:
    # With a process group open, sys.exit can block in atexit teardown waiting for peers that
    # are themselves stuck in a collective: leave at once instead of hanging.
    # Looked up, not imported: an error found before torch was loaded must not pay for loading it.
    dist = sys.modules.get("torch.distributed")
    try:
        return dist is not None and dist.is_available() and dist.is_initialized()
    except Exception:
        return False
