"""The project's checkpoint format: each rank writes the pieces of parameters and optimizer state
it owns, addressed by parameter name and element range, not by rank; rank 0 commits them
together (store.py). Any layout reads them back: a rank assembles the shard it now owns, one
tensor at a time, from memory-mapped files, so no process ever holds the whole model.

shards/<tp>_<pp>_<dp>.pt   {"pieces": {name: {"start", "numel", "master", "exp_avg",
                            "exp_avg_sq"}}, "rng": {...}, "coords": [tp, pp, dp_cp]}
                           (<dp>: the ZeRO shard, RankCoord.dp_cp; "dp" as earlier files)
index.json                 {name: {"shape": TP-local shape, "tp": TP size, "dim", "stride",
                            "vocab", "pieces": [[file, tp_rank, start, numel], ...]}}
meta.json                  format, step, layout, client state (data position, schedule, loss
                            scale, Adam step), files and sizes (store.py)"""
from __future__ import annotations

import dataclasses
import errno
import json
import logging
import math
import os
import threading
import time
from dataclasses import asdict
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from megatron.base import store
from megatron.checkpoint import experts, local_tier
from megatron.base.records import CheckpointMeta
from megatron.checkpoint.snapshot import Buffers, Snapshot, write_file
from megatron.checkpoint.state import Partition, RankState, resize_rows
from megatron.config.errors import InputError, free_bytes
from megatron.parallel.agree import rank0_decides
from megatron.parallel.layers import shard
from megatron.parallel.state import RankCoord, dense_grid

log = logging.getLogger(__name__)


def shard_file(c: RankCoord) -> str:
    return f"{store.SHARDS}/tp{c.tp:02d}_pp{c.pp:03d}_dp{c.dp_cp:05d}.pt"


# --- save -------------------------------------------------------------------------------------

def _write_failure(path: str, rank: int, error: BaseException, needed: int) -> str:
    """Why this rank's file could not be written, a full disk named as such. torch.save into a
    file object raises RuntimeError ("unexpected pos ...") with the file's ENOSPC OSError as its
    context (torch 2.13); should a torch lose that context, a torch write failure with less space
    free than the tensors need is a full disk too."""
    what = f"the checkpoint shard of rank {rank}"
    full = store.disk_full(path, what, error, needed, at_least=True)
    if full is None and isinstance(error, RuntimeError) and any(
            s in str(error) for s in ("unexpected pos", "file write failed")):
        free = free_bytes(path)
        if free is not None and free < needed:
            full = store.disk_full(path, what, OSError(errno.ENOSPC, "disk full"), needed,
                                   at_least=True)
    if full is not None:
        return str(full)
    if isinstance(error, (OSError, RuntimeError)):
        return str(error)
    return f"{type(error).__name__} while writing {path}: {error}"


def _describe(rs: RankState, rel: str) -> Dict[str, Any]:
    out = {}
    for p in rs.params:
        entry = {"shape": list(p.shape), **asdict(p.partition),
                 "pieces": [[rel, rs.coords.tp, f.start, f.numel] for f in p.fragments]
                 if rs.written(p) else []}
        out[p.name] = experts.to_global(entry, p) if p.experts is not None else entry
    return out


def _build_index(described: List[Dict[str, Any]], tp: int) -> Dict[str, Any]:
    """Merges every rank's description; refuses to commit a parameter whose pieces do not tile
    each tensor-parallel shard exactly (a bug, never a silent hole in a checkpoint)."""
    index: Dict[str, Any] = {}
    for desc in described:
        for name, d in desc.items():
            entry = index.setdefault(name, {**{k: v for k, v in d.items() if k != "pieces"},
                                            "tp": tp, "pieces": []})
            seen = {(p[1], p[2], p[3]) for p in entry["pieces"]}
            # The tied embedding lives on the first and the last stage: keep one copy.
            entry["pieces"] += [p for p in d["pieces"] if (p[1], p[2], p[3]) not in seen]
    for name, entry in index.items():
        numel = math.prod(entry["shape"])
        for t in range(tp if entry["dim"] is not None else 1):
            spans = sorted((p[2], p[3]) for p in entry["pieces"] if p[1] == t)
            at = 0
            for start, n in spans:
                if start != at:
                    break
                at += n
            if at != numel:
                raise RuntimeError(f"checkpoint pieces of {name} (TP rank {t}) cover {at} of "
                                   f"{numel} elements; not committing an incomplete checkpoint")
    return index


# A test hook for the fault tests: "R" fails rank R's writer with an injected error at every
# save, "R:S" at the save of step S only.
FAIL_WRITER_VAR = "MEGATRON_TEST_FAIL_WRITER"
SLOW_WRITER_VAR = "MEGATRON_TEST_SLOW_WRITER"


def _slow_writer() -> None:
    """A test hook: MEGATRON_TEST_SLOW_WRITER=<seconds> holds each background write and drain
    back that long, so a fault test can kill a rank while one is in flight."""
    delay = os.environ.get(SLOW_WRITER_VAR)
    if delay:
        time.sleep(float(delay))


def _injected_failure(rank: int, step: int) -> bool:
    value = os.environ.get(FAIL_WRITER_VAR)
    if not value:
        return False
    who, _, when = value.partition(":")
    return who == str(rank) and (not when or when == str(step))


class PendingSave:
    """One checkpoint on its way to disk, in three parts: the constructor prepares the staging
    folder (collective: rank 0 makes it, then a barrier) and starts the snapshot of this rank's
    state into host memory (snapshot.py); write() streams it to its file and fsyncs it, in the
    caller's thread or, with start_writer(), in a writer thread while training goes on (local
    I/O only); finish() commits (collective: every rank's outcome to rank 0, which commits or
    refuses). Only write() touches the disk of this rank, so a failure there is an outcome to
    report, never an exception that could leave the other ranks waiting."""

    def __init__(self, ckpt_dir: str, step: int, rs: RankState, meta: CheckpointMeta,
                 keep_last: int, buffers: Optional[Buffers] = None,
                 local_dir: Optional[str] = None):
        self.t0 = time.perf_counter()
        self.ckpt_dir, self.step, self.meta, self.keep_last = ckpt_dir, step, meta, keep_last
        self.rank = dist.get_rank()
        tag = store.tag_for(step)
        self.final, self.staging = os.path.join(ckpt_dir, tag), store.staging_folder(ckpt_dir,
                                                                                    tag)
        if self.rank == 0:
            os.makedirs(ckpt_dir, exist_ok=True)
            store.finish_deletions(ckpt_dir)  # before writing: a full disk may be their doing
            store.remove_stale_staging(self.staging)
            os.makedirs(os.path.join(self.staging, store.SHARDS))
        dist.barrier()
        self.rel = shard_file(rs.coords)
        # Its own copy: training may change the state as soon as the copies are done.
        self.snapshot: Optional[Snapshot] = Snapshot(rs, buffers).start()
        self.copied = self.snapshot.copied  # kept: the writer lets go of the snapshot
        self.description = _describe(rs, self.rel)
        self.error: Optional[str] = None
        self.size, self.write_s = 0, 0.0
        self.local: Optional[str] = None
        if local_dir:
            try:
                self.local = local_tier.local_file(local_dir, ckpt_dir, step, self.rel)
            except OSError as e:
                self.error = (f"rank {self.rank}: checkpoint.save_local_dir={local_dir!r} cannot "
                              f"take its checkpoint file ({e}); point it at node-local "
                              "storage this rank can write, or unset it")
        self._writer: Optional[threading.Thread] = None

    def write(self) -> None:
        """The file, into the staging folder; with a local tier, into the local file first
        (unless write_local() did already) and then drained into the staging folder."""
        if self.local is not None and self.snapshot is not None:
            self.write_local()
        t0, path = time.perf_counter(), os.path.join(self.staging, self.rel)
        if self.error is not None:
            return
        try:
            _slow_writer()
            if self.local is None:
                self._write_snapshot(path)
            else:
                self.size = local_tier.drain(self.local, path)
        except BaseException as e:  # whatever it is, it is this save's outcome to report
            store.remove_quietly(path)  # rank 0 removes the staging folder once all reported
            self.error = f"rank {self.rank}: {_write_failure(path, self.rank, e, self.size)}"
        self.write_s += time.perf_counter() - t0

    def write_local(self) -> None:
        """The file, into the node-local tier (checkpoint.save_local_dir); drained by write()."""
        if self.error is not None or self.local is None:
            return
        t0 = time.perf_counter()
        try:
            self._write_snapshot(self.local)
        except BaseException as e:
            store.remove_quietly(self.local)
            self.error = f"rank {self.rank}: {_write_failure(self.local, self.rank, e, self.size)}"
        self.write_s += time.perf_counter() - t0

    def _write_snapshot(self, path: str) -> None:
        snap, self.snapshot = self.snapshot, None  # the host memory goes back once written
        self.size = snap.nbytes()  # what the file needs at least, should its write fail
        try:
            if _injected_failure(self.rank, self.step):
                snap.wait_copied()
                raise RuntimeError(f"an error injected into the writer ({FAIL_WRITER_VAR})")
            self.size = write_file(path, snap)
        finally:
            snap.copied.wait()  # the copy thread must not write into buffers reused later

    def start_writer(self) -> None:
        """write() in a thread: training goes on while the file is written."""
        self._writer = threading.Thread(target=self.write, daemon=True,
                                        name=f"checkpoint-writer-{self.step}")
        self._writer.start()

    def busy(self) -> bool:
        return self._writer is not None and self._writer.is_alive()

    def failed(self) -> bool:
        return self.error is not None

    def wait_copied(self) -> None:
        """Until the snapshot's copies are done (before the state may change again)."""
        self.copied.wait()

    def join(self) -> float:
        """Waits for the writer thread; returns the seconds waited."""
        t0 = time.perf_counter()
        if self._writer is not None:
            self._writer.join()
        return time.perf_counter() - t0

    def finish(self) -> Dict[str, float]:
        """Collective (after write() or join()). Returns seconds (from the start) and bytes of
        the committed checkpoint; an InputError naming the cause on every rank otherwise."""
        rank = self.rank
        gathered = [None] * dist.get_world_size() if rank == 0 else None
        mine = (self.error, self.rel, self.size, {} if self.error else self.description)
        dist.gather_object(mine, gathered, dst=0)
        outcome = [None]
        if rank == 0:
            outcome[0] = _commit(self.staging, self.final, gathered, self.meta, self.keep_last,
                                 self.ckpt_dir)
        dist.broadcast_object_list(outcome, src=0)
        status, info = outcome[0]
        if status == "committed":  # an error after the commit point: the step is there
            raise InputError(store.committed_message(self.final, info))
        if status != "ok":
            raise InputError(f"checkpoint {self.final} was not committed: {info}")
        return {"seconds": time.perf_counter() - self.t0, "bytes": float(info)}


def save(ckpt_dir: str, step: int, rs: RankState, meta: CheckpointMeta,
         keep_last: int = 0) -> Dict[str, float]:
    """Collective: every rank writes its file into the staging folder, rank 0 checks that the
    pieces are complete, writes index and meta, and commits. Returns seconds and bytes."""
    pending = PendingSave(ckpt_dir, step, rs, meta, keep_last)
    pending.write()
    return pending.finish()


def _commit(staging, final, gathered, meta, keep_last, ckpt_dir):
    """Rank 0: commits the staging folder when every rank wrote its file, else removes it.
    Returns ("ok", bytes), ("failed", the reason in one line: nothing was committed) or
    ("committed", what failed after the commit point: the checkpoint is complete)."""
    errors = [g[0] for g in gathered if g[0]]
    if errors:
        n = len(errors) - 1
        more = f" ({n} other rank{'s' if n > 1 else ''} failed too)" if n else ""
        return "failed", errors[0] + more + _discard(staging)
    try:
        index = _build_index([g[3] for g in gathered], meta.layout.tensor_parallel_size)
        files = {g[1]: g[2] for g in gathered}
        index_bytes = json.dumps(index, sort_keys=True).encode()
        store.write_durable(os.path.join(staging, store.INDEX), index_bytes,
                            "the checkpoint's index")
        files[store.INDEX] = len(index_bytes)
        store.write_json(os.path.join(staging, store.META),
                         dataclasses.replace(meta, files=files).to_json(), "the checkpoint's meta")
    except (OSError, RuntimeError, InputError) as e:
        return "failed", str(e) + _discard(staging)
    try:
        if os.path.exists(final):
            # A folder of this step that resume skipped (damaged), or one a run that resumed
            # from an older step wrote before: set aside under a name resume never reads.
            aside = f"{final}.superseded-{int(time.time())}"
            os.rename(final, aside)
            log.warning("%s existed already; moved to %s, keeping the new checkpoint", final,
                        aside)
        store.commit(staging, final)
    except store.AfterCommit as e:
        return "committed", str(e)
    except (OSError, RuntimeError, InputError) as e:
        return "failed", str(e) + _discard(staging)
    try:  # after the commit point: whatever fails here, the checkpoint is committed
        for gone in store.prune(ckpt_dir, keep_last):
            log.info("removed %s (checkpoint.keep_last=%d)", gone, keep_last)
    except Exception as e:  # noqa: BLE001
        return "committed", f"removing older checkpoints (checkpoint.keep_last={keep_last}) " \
                            f"failed: {e}"
    return "ok", sum(files.values())


def _discard(staging: str) -> str:
    """Removes the staging folder of a save that will not commit; the clause for its message."""
    store.remove_quietly(staging)
    if os.path.exists(staging):
        return f"; the staging folder {staging} could not be removed: delete it"
    return f"; the staging folder {staging} was removed"


# --- load -------------------------------------------------------------------------------------

class Reader:
    """Assembles tensor-parallel shards of a committed checkpoint for any layout."""

    def __init__(self, folder: str, index: Dict[str, Any], last_good: Optional[str] = None):
        self.folder, self.index, self.last_good = folder, index, last_good
        self._files: Dict[str, Any] = {}

    def file(self, rel: str) -> Dict[str, Any]:
        if rel not in self._files:
            path = os.path.join(self.folder, rel)
            try:
                self._files[rel] = torch.load(path, map_location="cpu", mmap=True,
                                              weights_only=True)
            except Exception as e:  # torch raises many types for a damaged zip or pickle
                raise InputError(self.damaged(path, e)) from None
        return self._files[rel]

    def damaged(self, path: str, error: Exception) -> str:
        older = (f"the newest older checkpoint is {self.last_good}: move or delete "
                 f"{self.folder} to resume from it") if self.last_good else \
            "no older checkpoint exists"
        return f"checkpoint file {path} cannot be read ({type(error).__name__}: {error}); {older}"

    def entry(self, name: str) -> Dict[str, Any]:
        if name not in self.index:
            raise InputError(f"checkpoint {self.folder} has no parameter {name!r}; it was "
                             "written for another model")
        return self.index[name]

    def old_shard(self, name: str, key: str, tp_rank: int,
                  span: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        """Flat elements of the old TP rank's shard (all, or [start, start+numel) of span)."""
        e = self.entry(name)
        lo, n = span if span else (0, math.prod(e["shape"]))
        out = torch.empty(n, dtype=torch.float32)
        for rel, t, start, count in e["pieces"]:
            a, b = max(lo, start), min(lo + n, start + count)
            if t != tp_rank or a >= b:
                continue
            piece = self.file(rel)["pieces"][name]
            out[a - lo:b - lo] = piece[key][a - start:b - start]
        return out

    def merged(self, name: str, key: str) -> torch.Tensor:
        """The unsharded tensor (TP=1), padded vocabulary rows as the source layout had them."""
        e = self.entry(name)
        shards = [self.old_shard(name, key, t).view(e["shape"]) for t in range(e["tp"])]
        if e["dim"] is None or e["tp"] == 1:
            return shards[0]
        blocks = [s.chunk(e["stride"], dim=e["dim"]) for s in shards]
        return torch.cat([blocks[t][b] for b in range(e["stride"]) for t in range(e["tp"])],
                         dim=e["dim"])

    def same_split(self, name: str, shape, tp: int) -> bool:
        """Whether this rank's shard of `name` is an old TP rank's shard, unchanged."""
        e = self.entry(name)
        return list(shape) == e["shape"] and (e["dim"] is None or e["tp"] == tp)

    def old_rank(self, name: str, tp_rank: int) -> int:
        """The old TP rank holding what tp_rank holds now (same_split): replicated ones all do."""
        return tp_rank if self.entry(name)["dim"] is not None else 0

    def new_shard(self, name: str, key: str, shape, partition: Partition, tp: int,
                  tp_rank: int) -> torch.Tensor:
        """This rank's shard in the new layout (flat), assembled one tensor at a time."""
        if self.same_split(name, shape, tp):
            return self.old_shard(name, key, self.old_rank(name, tp_rank))
        full = self.merged(name, key)
        if partition.vocab:
            full = resize_rows(full, shape[0] * tp)
        if partition.dim is None:
            piece = full
        else:
            piece = shard(full, partition.dim, tp_rank, tp, partition.stride)
        if list(piece.shape) != list(shape):
            raise InputError(f"checkpoint {self.folder}: {name} gives this rank a "
                             f"{tuple(piece.shape)} shard, the model holds {tuple(shape)}")
        return piece.reshape(-1)


def read_meta(folder: str) -> Tuple[CheckpointMeta, Dict[str, Any]]:
    """meta.json and index.json of a committed checkpoint (rank 0 reads, all receive)."""
    def read():
        try:
            return store.read(folder)
        except (store.Incomplete, OSError) as e:
            raise InputError(f"checkpoint {folder} cannot be resumed: {e}") from None
    return rank0_decides(read)


@torch.no_grad()
def load(folder: str, rs: RankState, tp: int, pp: int, last_good: Optional[str] = None
         ) -> Tuple[CheckpointMeta, Optional[dict]]:
    """Collective: fills this rank's parameters, masters and moments from `folder` whatever its
    layout. Returns (meta, this rank's saved RNG state or None when the layout changed)."""
    meta, index = read_meta(folder)
    reader = Reader(folder, index, last_good)
    error = None
    try:
        for p in rs.params:
            if p.experts is not None:  # on the global expert axis, whatever the EP size
                experts.load_param(reader, p)
            else:
                _load_param(reader, p, tp, rs.coords.tp)
        rng = _rng_for(reader, meta, rs, tp, pp)
    except InputError as e:
        error, rng = str(e), None
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (error, [p.name for p in rs.params]))
    bad = [e for e, _ in gathered if e] or _unused(folder, index, gathered)
    if bad:
        raise InputError(bad[0])
    return meta, rng


def _unused(folder: str, index: Dict[str, Any], gathered) -> List[str]:
    """A message when the checkpoint holds tensors no rank of this model loaded: weights of a
    variant this run does not select (an attention core's own, say) would be dropped silently."""
    unused = sorted(set(index) - {name for _, names in gathered for name in names})
    if not unused:
        return []
    shown = ", ".join(unused[:5]) + (f" and {len(unused) - 5} more" if len(unused) > 5 else "")
    return [f"checkpoint {folder} holds tensors this model has no place for ({shown}); it was "
            "written for another model (another variant with weights of its own?): resume "
            "with the config it was trained with (its run directory keeps config.yaml)"]


def _load_param(reader: Reader, p, tp: int, tp_rank: int) -> None:
    master = None
    if p.full is not None:
        master = reader.new_shard(p.name, "master", p.shape, p.partition, tp, tp_rank)
        p.full.copy_(master.view(p.full.shape).to(p.full.dtype))
    same = reader.same_split(p.name, p.shape, tp)
    for f in p.fragments:
        span = (f.start, f.numel)
        for key, dest in (("master", f.master), *f.moments.items()):
            if key == "master" and master is not None:
                src = master[f.start:f.start + f.numel]
            elif same:
                src = reader.old_shard(p.name, key, reader.old_rank(p.name, tp_rank), span)
            else:
                src = reader.new_shard(p.name, key, p.shape, p.partition, tp,
                                       tp_rank)[f.start:f.start + f.numel]
            dest.copy_(src)
        if f.weight is not None:
            f.weight.copy_(f.master.to(f.weight.dtype))


def _rng_for(reader: Reader, meta: CheckpointMeta, rs: RankState, tp: int, pp: int
             ) -> Optional[dict]:
    """The RNG state this rank saved when TP and PP are unchanged; None otherwise: the caller
    re-derives the streams. The streams do not vary along dp or cp, so any file of the old
    dp_cp group serves: this rank's own when the old group had it, else the old group's last."""
    lay = meta.layout
    if (lay.tensor_parallel_size, lay.pipeline_parallel_size) != (tp, pp):
        return None
    old = dense_grid(tp=tp, pp=pp, dp=lay.data_parallel_size, cp=lay.context_parallel_size)
    c = rs.coords._replace(dp_cp=min(rs.coords.dp_cp, old.group_size("dp_cp") - 1))
    return reader.file(shard_file(c))["rng"]
