"""One rank's shard file on its way to disk: a snapshot of its pieces in host memory, and the
stream that torch.save writes it through.

Each tensor of the file needs a storage of its own (torch.save writes a view's whole storage,
and the pieces are views into DeepSpeed's flat partitions). A synchronous save aliases the
state's memory (the state does not change until the file is written): no copy at all. An
asynchronous one copies into host buffers kept from save to save (fresh memory costs a page
fault per 4 KiB, which on the development VM took longer than the disk write); the copies run
in a thread, in file order, and the stream waits for a storage's copy just before writing it,
so copying and writing overlap instead of adding up. On a GPU the copies go
to pinned buffers on a side stream, and the default stream waits for that stream, so the next
step's kernels never change a tensor before it is copied.

The stream writes each storage with one system call and starts its writeback at once
(posix_fadvise DONTNEED starts writing dirty pages back without waiting for them, and keeps a
checkpoint from filling the page cache), so the disk works while the next storage is copied
and the final fsync finds little left. torch.save's per-record CRC32 is off for these files:
it cost more than the disk write on the development CPU (0.7 GB/s), and torch.load ignores it.
The bytes written are the same whoever writes them (the loop, a writer thread, a drain)."""
from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from megatron.base import store
from megatron.checkpoint.state import RankState

WRITEBACK_MIN = 4 << 20  # smaller writes are left to the kernel's own writeback


class Buffers:
    """Host buffers of the snapshots of one rank, kept from save to save (asynchronous saves:
    allocating and faulting in 12 bytes per element at every save would cost as much as the
    copy). Pinned when the state is on a GPU."""

    def __init__(self):
        self._by_key: Dict[Tuple[str, str], torch.Tensor] = {}

    def get(self, name: str, key: str, like: torch.Tensor) -> torch.Tensor:
        buf = self._by_key.get((name, key))
        if buf is None or buf.numel() != like.numel():
            buf = torch.empty(like.numel(), dtype=torch.float32,
                              pin_memory=like.device.type == "cuda")
            self._by_key[(name, key)] = buf
        return buf

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._by_key.values())


def snapshot_bytes(rs: RankState) -> int:
    """Host bytes a snapshot of this rank takes: 4 bytes each for the master and two moments of
    every element it owns (0 for a data-parallel replica that writes nothing)."""
    return sum(4 * f.numel * (1 + len(f.moments)) for p in rs.params if rs.written(p)
               for f in p.fragments)


def _alias(src: torch.Tensor) -> torch.Tensor:
    """A tensor with a storage of its own over src's memory, no copy: what a synchronous save
    writes, since the state does not change before the file is written. Its own storage makes
    torch.save write exactly these bytes (a view would bring its whole flat partition)."""
    if src.numel() == 0:
        return torch.empty(0, dtype=torch.float32)
    raw = (ctypes.c_char * (src.numel() * src.element_size())).from_address(src.data_ptr())
    return torch.frombuffer(raw, dtype=torch.float32)


def _aliasable(src: torch.Tensor) -> bool:
    return src.device.type == "cpu" and src.dtype == torch.float32 and src.is_contiguous()


class Snapshot:
    """The payload of this rank's shard file. With buffers (asynchronous saves) its tensors are
    copies, filled by a copy thread (start()); without, the caller writes the file before the
    state changes again, and each tensor is an alias of the state's memory (no copy) where it
    can be (CPU, fp32, contiguous), a copy otherwise."""

    def __init__(self, rs: RankState, buffers: Optional[Buffers] = None):
        self._jobs: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self._aliases: List[torch.Tensor] = []
        pieces: Dict[str, Any] = {}
        for p in rs.params:
            if rs.written(p):
                for f in p.fragments:  # a parameter has at most one contiguous piece per rank
                    pieces[p.name] = self._entry(p.name, f, buffers)
        self.payload = {"pieces": pieces, "rng": rs.rng, "coords": list(rs.coords)}
        self._ready = {dst.data_ptr(): threading.Event() for dst, _ in self._jobs
                       if dst.numel()}
        self.copied = threading.Event()
        self.error: Optional[BaseException] = None
        self.waited = 0.0  # seconds training waited for the copy (wait_copied)
        self._thread: Optional[threading.Thread] = None

    def _entry(self, name: str, f, buffers: Optional[Buffers]) -> Dict[str, Any]:
        entry: Dict[str, Any] = {"start": f.start, "numel": f.numel}
        for key, src in (("master", f.master), *f.moments.items()):
            src = src.detach().reshape(-1)
            if buffers is None and _aliasable(src):
                entry[key] = _alias(src)
                self._aliases.append(src)  # the memory the alias points into
                continue
            # Pinned only when kept: pinning fresh memory at every save costs more than the
            # copy it speeds up.
            dst = (buffers.get(name, key, src) if buffers is not None else
                   torch.empty(src.numel(), dtype=torch.float32))
            entry[key] = dst
            self._jobs.append((dst, src))
        return entry

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size()
                   for t in [dst for dst, _ in self._jobs] + self._aliases)

    def start(self) -> "Snapshot":
        """Starts the copies; returns at once (on a GPU, once they are queued)."""
        event = None
        if any(src.device.type == "cuda" for _, src in self._jobs):
            event = self._queue_device_copies()
        self._thread = threading.Thread(target=self._copy, args=(event,), daemon=True,
                                        name="checkpoint-snapshot")
        self._thread.start()
        return self

    def _queue_device_copies(self):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())  # the step that made the state is done
        with torch.cuda.stream(side):
            for dst, src in self._jobs:
                dst.copy_(src.reshape(-1), non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)  # later kernels wait for the copies
        event = torch.cuda.Event()
        event.record(side)
        return event

    def _copy(self, device_event) -> None:
        try:
            if device_event is not None:
                device_event.synchronize()
            for dst, src in self._jobs:
                if device_event is None:
                    dst.copy_(src.reshape(-1))
                if dst.numel():
                    self._ready[dst.data_ptr()].set()
        except BaseException as e:  # a copy that fails must not leave the writer waiting
            self.error = e
        finally:
            for ready in self._ready.values():
                ready.set()
            self.copied.set()

    def wait_copied(self) -> None:
        """Blocks until every copy is done (before the state may change again)."""
        if not self.copied.is_set():
            t0 = time.perf_counter()
            self.copied.wait()
            self.waited += time.perf_counter() - t0
        if self.error is not None:
            raise RuntimeError(f"copying the checkpoint snapshot failed: {self.error}")

    def ready_event(self, address: int) -> Optional[threading.Event]:
        return self._ready.get(address)


def _write(fd: int, data) -> int:
    return os.write(fd, data)


class _Stream:
    """The file object torch.save writes into (see the module's docstring)."""

    def __init__(self, fd: int, snapshot: Snapshot):
        self.fd, self.snapshot, self.at = fd, snapshot, 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        n = view.nbytes
        if n:  # a storage's bytes come as one write of that storage's memory
            ready = self.snapshot.ready_event(np.frombuffer(view, np.uint8).ctypes.data)
            if ready is not None:
                ready.wait()
                if self.snapshot.error is not None:
                    self.snapshot.wait_copied()  # raises the copy's error
        done = 0
        while done < n:  # one call writes at most about 2 GiB on Linux
            done += _write(self.fd, view[done:])
        if n >= WRITEBACK_MIN:
            os.posix_fadvise(self.fd, self.at, n, os.POSIX_FADV_DONTNEED)
        self.at += n
        return n

    def flush(self) -> None:
        pass


def write_file(path: str, snapshot: Snapshot) -> int:
    """Writes the snapshot's payload to `path` as torch.save does, fsynced; returns its size.
    OSError and torch's RuntimeError reach the caller (the file is left for it to remove)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        stream = _Stream(fd, snapshot)
        crc = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(False)
        try:
            torch.save(snapshot.payload, stream)
        finally:
            torch.serialization.set_crc32_options(crc)
        snapshot.wait_copied()
        store.fsync(fd)
        return stream.at
    finally:
        os.close(fd)


WRITER_BYTES = 64 << 20  # what a writer needs beside the snapshot: the pickled header, slack


def memory_shortfall(needed: int, ranks_on_node: int,
                     meminfo_path: str = "/proc/meminfo") -> Tuple[int, Optional[int]]:
    """(bytes missing, this rank's share of MemAvailable) for a snapshot of `needed` bytes plus
    WRITER_BYTES, the node's available memory shared by its ranks; (0, None) where the
    available memory cannot be read (not Linux): nothing is refused on a guess."""
    try:
        with open(meminfo_path) as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return 0, None
    share = available // max(1, ranks_on_node)
    return max(0, needed + WRITER_BYTES - share), share
