"""The node-local first tier of checkpoints (checkpoint.save_local_dir; on Frontier the node's NVMe,
/mnt/bb/$USER with #SBATCH -C nvme): each rank writes its shard there at the drive's speed, then
drains it into the run's staging folder on the shared file system, where rank 0 commits the
checkpoint with the usual protocol. Resume reads only committed checkpoints in run.dir, so a
node lost before its drain leaves the previous one to resume from; a local file is removed
once drained, and a save's local folder at the next save of the same run.

    <save_local_dir>/megatron-<12 hex digits of the checkpoints folder's path>/
        step_0000120/shards/tp00_pp000_dp00000.pt"""
from __future__ import annotations

import hashlib
import os
import shutil

from megatron.base import store

CHUNK = 64 << 20  # bytes per copy call: large enough that system calls do not count


def run_folder(local_dir: str, ckpt_dir: str) -> str:
    """This run's folder in the local tier (several runs may share a node's drive)."""
    digest = hashlib.sha1(os.path.abspath(ckpt_dir).encode()).hexdigest()[:12]
    return os.path.join(local_dir, f"megatron-{digest}")


def local_file(local_dir: str, ckpt_dir: str, step: int, rel: str) -> str:
    """Where this rank writes its shard of `step` first; its folder made, older steps' gone."""
    run = run_folder(local_dir, ckpt_dir)
    tag = store.tag_for(step)
    if os.path.isdir(run):
        for name in os.listdir(run):
            if name != tag:
                shutil.rmtree(os.path.join(run, name), ignore_errors=True)
    path = os.path.join(run, tag, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def drain(src: str, dst: str) -> int:
    """Copies the local file `src` to `dst` on the shared file system (kernel-side, in large
    chunks), fsyncs it, then removes `src`. Returns the bytes copied; OSError on failure (dst
    is left for the caller to remove)."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        size = os.fstat(fin.fileno()).st_size
        done = 0
        while done < size:
            n = os.sendfile(fout.fileno(), fin.fileno(), done, min(CHUNK, size - done))
            if n == 0:
                raise OSError(f"{src} ended after {done} of {size} bytes while draining it")
            done += n
        store.fsync(fout.fileno())
    os.remove(src)
    return done
