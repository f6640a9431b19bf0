"""On-disk cache of index arrays, built once and shared by every rank and later runs.

An entry is a directory NAME/ holding one .npy per array. NAME carries a hash of everything that
determines the arrays, so a change of data, split, sample count, sequence length or seed selects
another entry instead of reusing a stale one. An entry is written under a temporary name and
renamed into place, so a reader never sees a half-written one; a full disk removes it and is
one InputError naming the entry, the bytes it needs and the bytes free.

Who builds: with torch.distributed initialized, global rank 0 builds while the others wait in a
broadcast that also carries rank 0's error, if any (a failure there must not leave the other ranks
waiting forever). Without it, an exclusive file lock serializes processes that share the cache
(several single-process runs, or ranks before the process group exists)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import uuid
from typing import Callable, Dict, Iterable

import numpy as np

from megatron.config.errors import InputError, disk_full

log = logging.getLogger(__name__)

# Bump when the layout or the arithmetic of the arrays changes: old entries are then ignored.
INDEX_VERSION = "megatron-frontier-gpt-index-1"

Arrays = Dict[str, np.ndarray]


def file_digest(path: str) -> str:
    """Content hash of a file (the .idx: document sizes and layout)."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def key_digest(parts: dict) -> str:
    text = json.dumps({"version": INDEX_VERSION, **parts}, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _distributed():
    """torch.distributed when a process group is up; torch is imported only if already loaded,
    so tools that never touch torch stay light."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = torch.distributed
    return dist if dist.is_available() and dist.is_initialized() else None


def load_or_build(directory: str, name: str, names: Iterable[str],
                  build: Callable[[], Arrays]) -> Arrays:
    """The arrays of entry `name` under `directory`, building them first when missing."""
    path = os.path.join(directory, name)
    names = list(names)
    dist = _distributed()
    if dist is None:
        _build_if_missing(path, names, build)
    else:
        error = ""
        if dist.get_rank() == 0:
            try:
                _build_if_missing(path, names, build)
            except InputError as e:  # whole already (a full disk): every rank says the same
                error = str(e)
            except Exception as e:  # re-raised below on every rank, with its message
                error = f"building the data index {path} on rank 0 failed: " \
                        f"{type(e).__name__}: {e}"
        status = [error]
        dist.broadcast_object_list(status, src=0)
        if status[0]:
            raise InputError(status[0])
        if not _complete(path, names):
            raise InputError(f"data index {path}, built by rank 0, is not visible on rank "
                             f"{dist.get_rank()}: expected data.cache_dir on a filesystem shared "
                             f"by all nodes; set data.cache_dir to such a directory")
    return _load(path, names)


def _complete(path: str, names: Iterable[str]) -> bool:
    return all(os.path.isfile(os.path.join(path, f"{n}.npy")) for n in names)


def _build_if_missing(path: str, names, build: Callable[[], Arrays]) -> None:
    if _complete(path, names):
        return
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create the index cache directory {directory} ({e}); expected "
                         f"a writable directory: set data.cache_dir") from None
    with _locked(path + ".lock"):
        if _complete(path, names):  # built by another process while we waited
            return
        if os.path.isdir(path):
            log.warning("removing incomplete index cache entry %s", path)
            shutil.rmtree(path)
        log.info("building data index %s", path)
        try:
            _write_atomically(path, build())
        finally:
            # Safe while holding it, built or not: whoever holds or next creates a lock file
            # re-checks completeness before building.
            with contextlib.suppress(OSError):
                os.remove(path + ".lock")


def _write_atomically(path: str, arrays: Arrays) -> None:
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.makedirs(tmp)
    try:
        for key, value in arrays.items():
            np.save(os.path.join(tmp, f"{key}.npy"), value, allow_pickle=False)
        try:
            os.rename(tmp, path)
        except OSError:
            if not os.path.isdir(path):  # not a lost race: a real failure
                raise
    except OSError as e:
        # .npy headers are under 1 KiB an array: the arrays' bytes are what the entry needs.
        full = disk_full(path, "the data index cache", e,
                         sum(a.nbytes for a in arrays.values()), at_least=True)
        if full is None:
            raise
        raise full from None
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)


@contextlib.contextmanager
def _locked(lock_path: str):
    try:
        import fcntl
    except ImportError:  # no flock: the atomic rename alone keeps entries whole
        yield
        return
    try:
        f = open(lock_path, "a+")
    except OSError as e:
        raise InputError(f"cannot write the index cache lock {lock_path} ({e}); expected a "
                         f"writable data.cache_dir (default: the data's directory); set "
                         f"data.cache_dir to one") from None
    with f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _load(path: str, names: Iterable[str]) -> Arrays:
    out = {}
    for n in names:
        file = os.path.join(path, f"{n}.npy")
        try:
            out[n] = np.load(file, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as e:
            raise InputError(f"data index file {file} is unreadable ({e}); expected a .npy "
                             f"written by megatron; delete {path} to rebuild it") from None
    return out
