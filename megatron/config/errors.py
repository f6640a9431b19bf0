"""The one error type for bad user input. Entry points print its message and exit non-zero.

A full disk (ENOSPC, or EDQUOT for a quota) is bad input too, not a bug: disk_full() is the one
message for it, used by every writer (checkpoints, run files, metrics, data caches, preprocessing
output). Standard library only."""
import errno
import os
import re
from typing import Optional

_FULL = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}


def ascii_digits(text: str) -> bool:
    """Whether `text` is a whole number in ASCII digits: str.isdigit() alone takes '²' (which
    int() then refuses with a ValueError) and other scripts' digits ('٣', which int() reads)."""
    return text.isascii() and text.isdigit()


# What a shell expands in a path and a program does not: $NAME, ${NAME}, ~ or ~user at its start
_SHELL_SYNTAX = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|^~[^/]*")


def shell_syntax(path: str) -> Optional[str]:
    """The first piece of shell syntax in `path` ('$MEMBERWORK', '~'), or None. A config value,
    or a flag written --output=~/x (bash expands ~ at a word's start only), reaches the program
    as written, where it would name a folder called '$MEMBERWORK' or '~'."""
    found = _SHELL_SYNTAX.search(path)
    return found.group(0) if found else None


def as_shell_would(path: str) -> Optional[str]:
    """`path` expanded as the shell would have expanded it here, or None where it cannot be
    (a variable that is not set)."""
    expanded = os.path.expandvars(os.path.expanduser(path))
    return None if shell_syntax(expanded) else expanded


def unexpanded(path: str) -> str:
    """For a path that was not found: a note when it holds shell syntax no shell expanded
    (--config=~/a.yaml: bash expands ~ at a word's start only), else ''."""
    token = shell_syntax(path)
    if token is None:
        return ""
    expanded = as_shell_would(path)
    return (f" ({token!r} in it was not expanded by a shell, which expands ~ only at a word's "
            f"start and nothing in a config{f'; here it is {expanded}' if expanded else ''})")


def ascii_int(text: str) -> int:
    """int(text) for text in ASCII only (int() reads '٣' as 3); ValueError otherwise."""
    if not text.isascii():
        raise ValueError(f"not ASCII: {text!r}")
    return int(text)


def ascii_float(text: str) -> float:
    """float(text) for text in ASCII only (float() reads '٣' too); ValueError otherwise."""
    if not text.isascii():
        raise ValueError(f"not ASCII: {text!r}")
    return float(text)


class ConfigError(ValueError):
    """A config value is wrong: names the field, the value, what was expected and the fix."""

    def __init__(self, field: str, value, expected: str, fix: str = ""):
        self.field, self.value, self.expected = field, value, expected
        # a command-line flag (megatron-plan's --nodes) is not a config field --set could reach
        hint = fix or (f"change {field} on the command line" if field.startswith("--")
                       else f"set it with --set {field}=... or in the YAML file")
        super().__init__(f"{field}={value!r} is invalid: expected {expected}; {hint}")


class InputError(ValueError):
    """Bad input that is not a config field (a data file, the environment); the message is whole."""


class Diverged(RuntimeError):
    """Training stopped itself: the loss or the gradients stopped being finite, or a loss spike
    asked for a stop. The message names the step, the cause and the last good checkpoint."""


class BadNode(RuntimeError):
    """This rank's node failed its health check before training (launch/health.py): the message
    names the node and the check. The job chain leaves such nodes out of the next job."""


def free_bytes(path: str) -> Optional[int]:
    """Bytes an unprivileged writer may still use on the file system that holds `path` (or its
    nearest existing parent); None when that cannot be asked."""
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        st = os.statvfs(path or ".")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _full_cause(error: BaseException) -> Optional[OSError]:
    """The ENOSPC/EDQUOT OSError behind `error`: itself, or one it was raised from or while
    handling. torch.save into a Python file raises RuntimeError ("unexpected pos ...") with the
    file's OSError as its context; into a path the cause is lost (an iostream error)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError) and error.errno in _FULL:
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def disk_full(path: str, what: str, error: BaseException, needed: Optional[int] = None,
              at_least: bool = False) -> Optional[InputError]:
    """The one-line InputError for a write of `what` to `path` that failed because the disk (or
    the quota) is full; None when `error` is another failure. Asked only after a write failed."""
    cause = _full_cause(error)
    if cause is None:
        return None
    need = "" if needed is None else f"needs {'at least ' if at_least else ''}{needed:,} bytes, "
    free = free_bytes(path)
    room = "free space unknown" if free is None else f"{free:,} bytes free"
    return InputError(f"{path}: {_FULL[cause.errno]} while writing {what} ({need}{room}); free "
                      f"space on that file system (or raise the quota) or write elsewhere")
