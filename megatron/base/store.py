"""How a checkpoint reaches the disk: staged, flushed, committed by one atomic rename, found again.

    <run.dir>/checkpoints/
      step_0000100/              committed: visible only once every rank's files are on disk
        meta.json                written last (step, layout, the files with their sizes, ...)
        index.json               where the pieces of every parameter are (sharded.py)
        shards/tp00_pp000_dp00000.pt   one file per rank
      .staging-step_0000120/     a save in progress, or one a killed job left: never read
      .deleting-step_0000080/    a pruned checkpoint whose deletion a kill cut short: removed
                                 by the next save (finish_deletions)
      latest                     the newest committed tag, for people and scripts

meta.json is the typed record of records.py (CheckpointMeta); validate() parses it.

A folder named step_N exists only after rank 0 renamed a complete staging folder to it, so a kill
at any moment leaves either the old set of checkpoints or the new one. Nothing here deletes a
checkpoint it cannot prove complete; keep_last removes only older committed ones, after a newer
commit. No torch.distributed here: sharded.py decides when every rank agrees.

A full disk (ENOSPC, or EDQUOT for a quota) is bad input, not a bug: config.errors.disk_full()
turns it into one InputError naming the path, what was being written, the bytes it needed and the
bytes free, and the writer removes what it left half-written."""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from megatron.base import faults
from megatron.base.records import FORMAT, CheckpointMeta, RecordError
from megatron.config.errors import disk_full

log = logging.getLogger(__name__)

__all__ = ["FORMAT", "META", "INDEX", "SHARDS", "LATEST", "CheckpointMeta"]
META, INDEX, SHARDS, LATEST = "meta.json", "index.json", "shards", "latest"
_TAG = re.compile(r"^step_(\d{7,})$")
_STAGING, _DELETING = ".staging-", ".deleting-"


# What one save does on rank 0, in series (tests/unit/test_checkpoint_save_cost.py counts them
# in a real save): 9 fsyncs (its shard; index.json and meta.json, each file and folder; the
# staging folder; checkpoints/ after the rename; latest, file and folder), 4 renames, 4 files
# created. On a loaded parallel file system each costs a round trip to the metadata server
# whatever its size: the estimate of an unmeasured save prices the fsyncs at the latency the
# start-up probe measured (training/checkpointer.py).
SAVE_FSYNCS, SAVE_RENAMES, SAVE_FILES = 9, 4, 4


def tag_for(step: int) -> str:
    return f"step_{step:07d}"


def staging_folder(ckpt_dir: str, tag: str) -> str:
    return os.path.join(ckpt_dir, _STAGING + tag)


def fsync(fd: int) -> None:
    """Every fsync of a checkpoint's files and folders (the per-file cost a save pays, which
    the start-up probe prices: training/checkpointer.py)."""
    faults.file_latency()
    os.fsync(fd)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        fsync(fd)
    finally:
        os.close(fd)


def remove_quietly(path: str) -> None:
    """Removes a half-written file or folder after a failed write; a failure to remove it must
    not hide the error that caused it."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.remove(path)
        except OSError:
            pass


def write_durable(path: str, data: bytes, what: str = "a checkpoint file") -> None:
    """Writes `data` to `path` through a temporary name, flushed, then renamed into place. A full
    disk is an InputError naming `what`, and the temporary file is removed."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        remove_quietly(tmp)
        full = disk_full(path, what, e, len(data))
        if full is None:
            raise
        raise full from None
    fsync_dir(os.path.dirname(path) or ".")


def write_json(path: str, obj: Any, what: Optional[str] = None) -> None:
    write_durable(path, json.dumps(obj, indent=1, sort_keys=True).encode(),
                  what or os.path.basename(path))


class AfterCommit(Exception):
    """An error after the rename that committed `final`: the checkpoint is complete and resume
    continues from it; only what follows the commit (the directory's flush, `latest`, the prune
    of older checkpoints) failed. Callers say so: never "not committed" after the commit point."""

    def __init__(self, final: str, cause: BaseException):
        super().__init__(str(cause))
        self.final, self.cause = final, cause


def committed_message(final: str, what: str) -> str:
    """The one message of an error after `final` was committed (AfterCommit, or a record of the
    save that could not be written): which step is committed and that resume uses it."""
    m = _TAG.match(os.path.basename(final))
    step = f"step {int(m.group(1))}" if m else "its step"
    return (f"checkpoint {final} is committed ({step} is complete and resume continues from "
            f"it), but after its commit {what}")


def commit(staging: str, final: str) -> None:
    """The one atomic step: a complete staging folder becomes the checkpoint `final`. An error
    before the rename leaves nothing committed; one after it raises AfterCommit."""
    fsync_dir(staging)
    os.rename(staging, final)  # the commit point
    parent = os.path.dirname(final)
    try:
        fsync_dir(parent)
    except OSError as e:
        raise AfterCommit(final, OSError(f"flushing the folder {parent} to disk failed ({e})")
                          ) from None
    try:
        point_latest(parent, os.path.basename(final))
    except Exception as e:  # noqa: BLE001 - whatever it is, it happened after the commit
        raise AfterCommit(final, e) from None


def point_latest(ckpt_dir: str, tag: str) -> None:
    """`latest` in ckpt_dir names `tag` (written whole: a reader sees the old tag or the new)."""
    write_durable(os.path.join(ckpt_dir, LATEST), tag.encode(),
                  f"the pointer to the newest checkpoint ({LATEST})")


class Incomplete(Exception):
    """A checkpoint folder that cannot be resumed from; the message says why."""


def _read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise Incomplete(f"{os.path.basename(path)} is missing") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise Incomplete(f"{os.path.basename(path)} is not valid JSON ({e})") from None


def validate(folder: str) -> CheckpointMeta:
    """meta.json of a committed checkpoint, after checking that every file it lists is there
    with the size it was written with. Raises Incomplete with the reason."""
    if not os.path.isfile(os.path.join(folder, META)) and any(
            n.endswith("_model_states.pt") for n in os.listdir(folder)):
        raise Incomplete("it is a DeepSpeed checkpoint of an older version of this project "
                         "(no meta.json); continue from its weights with megatron-convert "
                         "to-single and checkpoint.init_from")
    try:
        meta = CheckpointMeta.from_json(_read_json(os.path.join(folder, META)))
    except RecordError as e:
        raise Incomplete(f"meta.json is not a {FORMAT} record: {e}") from None
    for name, size in meta.files.items():
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise Incomplete(f"{name} is missing")
        actual = os.path.getsize(path)
        if actual != size:
            raise Incomplete(f"{name} has {actual} bytes, {size} were written")
    if INDEX in meta.files:
        # The size alone passes a file overwritten in place (garbage, {} or a list of the same
        # length): the index must also read as what sharded.py writes, naming only listed files.
        problem = index_problem(_read_json(os.path.join(folder, INDEX)), meta.files)
        if problem:
            raise Incomplete(f"{INDEX} is damaged: {problem}")
    return meta


_ENTRY_KEYS = ("shape", "tp", "dim", "stride", "pieces")


def index_problem(index: Any, files: Dict[str, int]) -> Optional[str]:
    """What is wrong with index.json's content ({name: {"shape", "tp", "dim", "stride",
    "pieces": [[file, tp_rank, start, numel], ...]}}, sharded.py), or None."""
    if not isinstance(index, dict) or not index:
        return f"it holds {type(index).__name__} {str(index)[:40]!r}, not the parameters' entries"
    for name, entry in index.items():
        if not isinstance(entry, dict) or any(k not in entry for k in _ENTRY_KEYS):
            return f"the entry of {name!r} lacks {', '.join(_ENTRY_KEYS)}"
        shape, pieces = entry["shape"], entry["pieces"]
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            return f"the shape of {name!r} is {shape!r}"
        if not isinstance(pieces, list) or not pieces:
            return f"{name!r} has no pieces"
        for piece in pieces:
            if not (isinstance(piece, list) and len(piece) == 4 and piece[0] in files):
                return f"a piece of {name!r} is {str(piece)[:60]}, not [a listed file, TP rank, " \
                       "start, count]"
    return None


def is_valid(folder: str) -> bool:
    try:
        validate(folder)
        return True
    except (Incomplete, OSError):
        return False


def read(folder: str) -> Tuple[CheckpointMeta, Dict[str, Any]]:
    """(meta, index) of a committed checkpoint after validate(); raises Incomplete."""
    meta = validate(folder)
    return meta, _read_json(os.path.join(folder, INDEX))


@dataclass
class Found:
    folder: str
    step: int
    meta: CheckpointMeta


def _names(ckpt_dir: str) -> List[str]:
    """The entries of a checkpoint folder, none where it is missing. Another process may remove
    it between a look and the listing (rank 0's start-up storage probe makes the folder and
    removes it again when it made it: training/checkpointer.probe_storage), so a folder gone
    by then counts as empty rather than as an error."""
    try:
        return os.listdir(ckpt_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []


def committed(ckpt_dir: str) -> List[Tuple[int, str]]:
    """(step, folder) of every step_N folder, newest first (valid or not)."""
    out = []
    for name in _names(ckpt_dir):
        m = _TAG.match(name)
        if m and os.path.isdir(os.path.join(ckpt_dir, name)):
            out.append((int(m.group(1)), os.path.join(ckpt_dir, name)))
    return sorted(out, reverse=True)


def newest_complete(ckpt_dir: str) -> Tuple[Optional[Found], List[str]]:
    """The newest checkpoint that validates, and a line for every newer one skipped."""
    skipped = []
    for step, folder in committed(ckpt_dir):
        try:
            return Found(folder, step, validate(folder)), skipped
        except Incomplete as e:
            skipped.append(f"{folder}: {e}")
        except OSError as e:
            skipped.append(f"{folder}: cannot be read ({e})")
    return None, skipped


def set_aside_above(ckpt_dir: str, step: int, dest: str) -> List[str]:
    """Moves every step_N folder of ckpt_dir with N > step (complete or not) into the new folder
    dest, on the same file system (each move one rename; nothing is copied or deleted), then
    points `latest` at the newest complete checkpoint left, or removes it when none is. Returns
    the folders moved, as they were named."""
    above = [folder for s, folder in committed(ckpt_dir) if s > step]
    if not above:
        return []
    os.makedirs(dest)
    for folder in reversed(above):  # the oldest first: a kill midway leaves the newest in place
        os.rename(folder, os.path.join(dest, os.path.basename(folder)))
    fsync_dir(dest)
    fsync_dir(ckpt_dir)
    newest, _ = newest_complete(ckpt_dir)
    if newest is None:
        remove_quietly(os.path.join(ckpt_dir, LATEST))
    else:
        point_latest(ckpt_dir, os.path.basename(newest.folder))
    return above


def leftovers(ckpt_dir: str) -> List[str]:
    """Staging folders of saves that never committed (killed jobs), for a warning."""
    return sorted(os.path.join(ckpt_dir, n) for n in _names(ckpt_dir) if n.startswith(_STAGING))


def finish_deletions(ckpt_dir: str) -> List[str]:
    """Removes the .deleting-* folders of prunes a kill cut short: each was renamed out of sight
    before its deletion began, so nothing resumes from it, and left alone it would keep a whole
    checkpoint's space forever. Logs one line for each; returns the removed folders."""
    removed = []
    for name in sorted(_names(ckpt_dir)):
        doomed = os.path.join(ckpt_dir, name)
        if not name.startswith(_DELETING) or not os.path.isdir(doomed):
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        if os.path.exists(doomed):
            log.warning("could not remove %s, a pruned checkpoint whose deletion was cut short; "
                        "delete it by hand", doomed)
        else:
            log.warning("removed %s: a pruned checkpoint whose deletion was cut short (a killed "
                        "job)", doomed)
            removed.append(doomed)
    return removed


def prune(ckpt_dir: str, keep_last: int) -> List[str]:
    """Finishes deletions cut short (finish_deletions), then removes committed checkpoints older
    than the newest `keep_last` complete ones; folders that do not validate are left for a
    person to look at. Returns the folders removed for keep_last."""
    finish_deletions(ckpt_dir)
    if keep_last <= 0:
        return []
    kept, removed = 0, []
    for _, folder in committed(ckpt_dir):
        if not is_valid(folder):
            continue
        kept += 1
        if kept > keep_last:
            # Renamed first, so a deletion cut short never looks like a committed checkpoint.
            doomed = os.path.join(ckpt_dir, _DELETING + os.path.basename(folder))
            os.rename(folder, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
            removed.append(folder)
    return removed


def remove_stale_staging(folder: str) -> None:
    """A staging folder of the same tag left by a killed save: it was never visible."""
    if os.path.exists(folder):
        log.warning("removing %s, left by a save that never committed", folder)
        shutil.rmtree(folder)
