"""Where a command will write, checked before it reads or computes anything: one rule for every
output path of every command (megatron-train's run folders, megatron-plan's files,
megatron-convert's file and folder, megatron-report's folder, megatron-preprocess's prefixes).

Kinds of output:
- "dir": a directory, used if it exists, else created with any missing parents;
- "file": a file written (or replaced) in its directory, which is created if missing;
- "prefix": the start of file names (PREFIX.bin, PREFIX_text_document.idx), a "file" whose name
  part is not empty, '.' or '..'.

Refused, each as one InputError naming the field or flag, the path, what was expected and the
fix: a path with a newline or another unprintable character (logs, comments and scripts name
it on one line); a path with shell syntax no shell expanded ('$WORK/x' from a config,
--output=~/x, where bash leaves the tilde as it is), which would name a folder '$WORK' or '~'; a
file where a directory goes, the path itself or a part of it; a directory
where a file goes; a place that cannot be written, tried with a probe file rather than
permission bits (root passes every bit check, but not a read-only mount or an immutable
folder). The check creates nothing: a missing directory must be creatable, that is its nearest
existing ancestor a writable directory. Torch-free, so commands run it before heavy imports.

`write_whole` then writes such a file whole or not at all: into a hidden sibling renamed into
place, so a failed write (a full disk, an interrupt) leaves the old file or none, never a
truncated one, and a full disk is one line naming the file and the room left."""
from __future__ import annotations

import os
import shutil
import socket
from typing import Callable

from megatron.config.errors import InputError, as_shell_would, disk_full, shell_syntax

KINDS = ("dir", "file", "prefix")


def check_output(field: str, path: str, kind: str, example: str = "out") -> None:
    """One InputError for the first reason `path` cannot be written as `kind`; `example` is the
    name suggested where a directory was given for a file."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    noun = "directory" if kind == "dir" else "file"
    if not path:
        raise InputError(f"{field}: the path is empty: expected a {noun} to write; name one")
    if not path.isprintable():
        raise InputError(f"{field}: {path!r} has a newline or another unprintable character: "
                         f"expected a path of printable characters; rename the path")
    token = shell_syntax(path)
    if token is not None:
        expanded = as_shell_would(path)
        if token.startswith("~"):
            why, let = f"bash expands ~ at a word's start only, not after {field}=", path
        else:
            why, let = "a config value, or single quotes", f'"{path}"'
        raise InputError(f"{field}: {path!r} holds {token!r}, which no shell expanded ({why}), "
                         f"and would name a folder called {token!r}; write the path out"
                         f"{f' (here {expanded})' if expanded else ''}, or let the shell expand "
                         f"it: {field} {let}")
    absolute = os.path.abspath(path)
    if kind != "dir":
        base = os.path.basename(path)
        if base in ("", ".", "..") or os.path.isdir(path):
            what = "the start of the output files' names" if kind == "prefix" else "a file"
            raise InputError(f"{field}: {path!r} names a directory: expected {what} to write; "
                             f"add a name, e.g. {os.path.join(path, example)}")
        absolute = os.path.dirname(absolute)
    existing = absolute
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        where = ("is a file, not a directory" if existing == os.path.abspath(path)
                 else f"lies inside the file {existing!r}, where a directory is needed")
        raise InputError(f"{field}: {path!r} {where}; remove the file or choose another path")
    probe = os.path.join(existing, f".write-test-{socket.gethostname()}-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        what = "" if existing == os.path.abspath(path) else f" (its folder {existing!r})"
        raise InputError(f"{field}: {path!r}{what} is not writable ({e.strerror}); choose a "
                         f"writable location or fix the folder (a read-only mount, an immutable "
                         f"folder: lsattr -d)") from None


def check_files(*flags_and_paths) -> None:
    """Each (flag, path) a command will write as a file (a None path: not asked for), and no
    two flags on one file (the second would overwrite the first)."""
    seen = {}
    for flag, path in flags_and_paths:
        if path is None:
            continue
        check_output(flag, path, "file")
        real = os.path.realpath(path)
        if real in seen:
            raise InputError(f"{flag}: {path!r} is {seen[real]}'s file too: expected another "
                             f"file (the second would overwrite the first); give each its own "
                             f"path")
        seen[real] = flag


def write_whole(path: str, what: str, write: Callable[[str], None]) -> None:
    """`write(tmp)` writes the content to a temporary sibling of `path` (same extension, for
    writers that take the format from it), renamed over `path` once complete; the folder is
    created if missing. `what` names the content in a full-disk message. A symbolic link is
    written through (its target replaced), and a file replaced keeps its permission bits (an
    sbatch script its x), as open(path, "w") would."""
    if os.path.islink(path):
        path = os.path.realpath(path)
    folder, name = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    stem, ext = os.path.splitext(name)
    tmp = os.path.join(folder, f".{stem}.tmp-{os.getpid()}{ext}")
    try:
        write(tmp)
        if os.path.exists(path):
            shutil.copymode(path, tmp)  # reads the old file's bits, sets them on our own tmp
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.remove(tmp)
        except OSError:
            pass
        full = disk_full(path, what, e)
        if full is not None:
            raise full from None
        raise


def write_text_whole(path: str, what: str, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)
    write_whole(path, what, write)
