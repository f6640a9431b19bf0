"""Shared pieces of the console entry points: logging setup, and one way for every entry point to
turn bad input into a single clear message and a non-zero exit instead of a traceback."""
from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from typing import Callable

from megatron.config.errors import (BadNode, ConfigError, Diverged, InputError, ascii_float,
                                    ascii_int)
from megatron.config.plugins import load_plugins

# Exit statuses shared by every entry point (README's troubleshooting table names them).
EXIT_BAD_INPUT = 2      # a config value, a file or the environment is wrong; the message says which
EXIT_DIVERGED = 3       # the run stopped itself on divergence (megatron-train)
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT
# 4: a rank's hang watchdog ended it (training/watchdog.py EXIT_HANG; it exits from its thread).
EXIT_BAD_NODE = 5       # this rank's node failed its health check (launch/health.py)


def count(least: int = 1, most: int = 2 ** 40) -> Callable[[str], int]:
    """An argparse `type` for a count flag: an integer from `least` to `most` (by default past
    any real count, short of where sums overflow a float). Anything else is argparse's one-line
    error naming the flag and the value, exit 2 ("argument --top: 0 is invalid: expected an
    integer >= 1")."""
    def parse(text: str) -> int:
        try:
            value = ascii_int(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected an integer >= "
                                             f"{least}")
        if value > most:
            raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected an integer from "
                                             f"{least} to {most:,}")
        return value
    parse.__name__ = f"integer >= {least}"
    return parse


def integer(text: str) -> int:
    """An argparse `type` for a whole number in ASCII digits: int() alone also takes other
    scripts' digits ('٣' is 3), which no command line means."""
    return ascii_int(text)


def number(text: str) -> float:
    """An argparse `type` for a number in ASCII digits (float() alone takes '٣' too)."""
    return ascii_float(text)


def seconds(zero: bool = False) -> Callable[[str], float]:
    """An argparse `type` for a duration flag: a finite number of seconds above 0 (or at least
    0 where `zero` means something, as a progress interval's "every update")."""
    def parse(text: str) -> float:
        try:
            value = ascii_float(text)
        except ValueError:
            value = float("nan")
        if not (0 <= value if zero else 0 < value) or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected seconds "
                                             f"{'>=' if zero else '>'} 0")
        return value
    parse.__name__ = f"seconds {'>=' if zero else '>'} 0"
    return parse


positive_seconds = seconds()


def setup_logging(rank: int = 0) -> None:
    level = logging.INFO if rank == 0 else logging.WARNING
    logging.basicConfig(level=level, format=f"[rank{rank}] %(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")


def entry_point(prog: str, interrupted: str = "interrupted") -> Callable:
    """Wraps an entry point's main(argv) -> int so that every command reports failures alike:

    ConfigError / InputError -> "<prog>: error: <message>" on stderr, exit 2
    OSError (a file that cannot be read or written) -> the same with the file's name, exit 2
    Diverged (megatron-train stopped itself) -> the same, exit 3
    BadNode (the node failed its health check before training) -> the same, exit 5
    KeyboardInterrupt -> "<prog>: <interrupted>", exit 130

    Anything else is a bug and keeps its traceback. When the command itself opened a process
    group, the process leaves at once (os._exit): sys.exit could block in exit-time teardown
    waiting for peers that are themselves stuck in a collective. A group that was open before the
    command started belongs to its caller (a program that calls main() as a function), which gets
    the status back instead."""
    def wrap(main):
        @functools.wraps(main)
        def wrapper(argv=None) -> int:
            caller_group = _distributed_started()
            try:
                load_plugins()  # MEGATRON_PLUGINS: what --set may name in every command
                return main(argv)
            except (ConfigError, InputError, Diverged, BadNode) as e:
                code = (EXIT_DIVERGED if isinstance(e, Diverged) else
                        EXIT_BAD_NODE if isinstance(e, BadNode) else EXIT_BAD_INPUT)
                return _leave(code, f"{prog}: error: {e}", caller_group)
            except OSError as e:
                return _leave(EXIT_BAD_INPUT, f"{prog}: error: {_os_message(e)}", caller_group)
            except KeyboardInterrupt:
                return _leave(EXIT_INTERRUPTED, f"{prog}: {interrupted}", caller_group)
        return wrapper
    return wrap


def _os_message(e: OSError) -> str:
    what = e.strerror or str(e)
    return f"{what}: {e.filename}" if e.filename else what


def _leave(code: int, message: str, caller_group: bool) -> int:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    if _distributed_started() and not caller_group:
        sys.stdout.flush()
        os._exit(code)
    return code


def _distributed_started() -> bool:
    # Looked up, not imported: an error found before torch was loaded must not pay for loading it.
    dist = sys.modules.get("torch.distributed")
    try:
        return dist is not None and dist.is_available() and dist.is_initialized()
    except Exception:
        return False

