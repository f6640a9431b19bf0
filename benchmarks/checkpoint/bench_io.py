"""A synchronous checkpoint save against the disk's own limit, in one run, alternating.

Each round writes, into the same folder: (1) `dd if=/dev/zero bs=16M conv=fsync` of the
checkpoint's byte count, (2) checkpoint.sharded.save of one rank holding every piece of the
133.6M-parameter model of results/checkpoint_cpu.md (8 layers, hidden 1024, vocabulary 32000:
12 bytes per parameter, 1.6 GB), timed as the checkpointer times it (snapshot, write, fsync,
commit), and (3) the save as it was before issue 22 (copy, then torch.save with CRC32 into a
buffered Python file, fsync), for reference. Rounds alternate so a busy disk slows all three.

    python benchmarks/checkpoint/bench_io.py --dir /path/on/the/disk --rounds 4 --out results.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import torch
import torch.distributed as dist

from megatron.base import store
from megatron.checkpoint import sharded
from megatron.base.records import CheckpointMeta, LayoutRecord, OptimizerRecord
from megatron.checkpoint.state import Fragment, LocalParam, Partition, RankState
from megatron.parallel.state import RankCoord


def model_state(hidden=1024, layers=8, vocab=32000, seq=1024) -> RankState:
    """Masters and Adam moments of a GPT-2-shaped model, as views into three flat fp32 buffers
    (as DeepSpeed's partitions are)."""
    h = hidden
    shapes = [("embedding.word", vocab * h), ("embedding.position", seq * h)]
    for i in range(layers):
        shapes += [(f"layers.{i}.{k}", n) for k, n in (
            ("qkv.weight", 3 * h * h), ("qkv.bias", 3 * h), ("proj.weight", h * h),
            ("proj.bias", h), ("fc1.weight", 4 * h * h), ("fc1.bias", 4 * h),
            ("fc2.weight", 4 * h * h), ("fc2.bias", h), ("norm1.weight", h),
            ("norm1.bias", h), ("norm2.weight", h), ("norm2.bias", h))]
    shapes += [("final_norm.weight", h), ("final_norm.bias", h)]
    total = sum(n for _, n in shapes)
    flats = [torch.randn(total) for _ in range(3)]
    params, at = [], 0
    for name, n in shapes:
        m, a, b = (f.narrow(0, at, n) for f in flats)
        params.append(LocalParam(name, (n,), Partition(),
                                 fragments=[Fragment(0, n, m, {"exp_avg": a, "exp_avg_sq": b})]))
        at += n
    return RankState(params, True, RankCoord(0, 0, 0), {"cpu": torch.get_rng_state()})


def meta(step: int) -> CheckpointMeta:
    layout = LayoutRecord(1, 1, 1, 1, 32000, 32000, {})
    return CheckpointMeta(step, 0, layout, time.time(), OptimizerRecord({}, 0, {}))


def dd(folder: str, nbytes: int) -> float:
    path = tempfile.mktemp(prefix="dd-", dir=folder)
    t0 = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=16M",
                    f"count={max(1, round(nbytes / (16 << 20)))}", "conv=fsync"],
                   check=True, capture_output=True)
    seconds = time.perf_counter() - t0
    return os.path.getsize(path) / seconds


def before(folder: str, rs: RankState) -> float:
    """The save of the previous version: a copy, then torch.save (CRC32 on) into open(...)."""
    path = os.path.join(folder, "before.pt")
    t0 = time.perf_counter()
    payload = {"pieces": {p.name: {"start": 0, "numel": f.numel,
                                   "master": f.master.to("cpu", torch.float32, copy=True),
                                   **{k: v.to("cpu", torch.float32, copy=True)
                                      for k, v in f.moments.items()}}
                          for p in rs.params for f in p.fragments},
               "rng": rs.rng, "coords": [0, 0, 0]}
    with open(path, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
        size = f.tell()
    return size / (time.perf_counter() - t0)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default=None, help="a folder on the disk to measure (default: a "
                   "temporary folder under the current directory)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", default=None, help="JSON file for the measurements")
    a = p.parse_args()
    folder = os.path.abspath(tempfile.mkdtemp(prefix="bench-ckpt-", dir=a.dir or "."))
    dist.init_process_group("gloo", init_method=f"file://{folder}/pg", rank=0, world_size=1)
    rs = model_state()
    rows = []
    try:
        for r in range(a.rounds):
            # Each of the three writes into space not freed just before (a freshly freed
            # extent of a thin-provisioned virtual disk writes several times faster).
            ckpt = os.path.join(folder, "saves")
            info = sharded.save(ckpt, r + 1, rs, meta(r + 1))
            nbytes = info["bytes"]
            row = {"round": r + 1, "bytes": nbytes, "dd_gbps": dd(folder, nbytes) / 1e9,
                   "save_gbps": nbytes / info["seconds"] / 1e9,
                   "before_gbps": before(folder, rs) / 1e9}
            for name in os.listdir(folder):
                if name not in ("pg",):
                    path = os.path.join(folder, name)
                    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
            row["ratio"] = row["save_gbps"] / row["dd_gbps"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        dist.destroy_process_group()
        shutil.rmtree(folder, ignore_errors=True)
    summary = {k: statistics.median(r[k] for r in rows)
               for k in ("dd_gbps", "save_gbps", "before_gbps", "ratio")}
    print("median", json.dumps(summary))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"rounds": rows, "median": summary, "store": store.FORMAT}, f, indent=1)


if __name__ == "__main__":
    main()
