"""What a save costs the training loop, synchronous against checkpoint.async_save, through
megatron-train, alternating in one run, with the disk's own limit measured in the same run.

The model of results/checkpoint_cpu.md (8 layers, hidden 1024, 16 heads, vocabulary 32000:
133.6M parameters, a 1.6 GB checkpoint), fp32, ZeRO-1, one process; 10 steps of sequence 128,
saving every 3 steps. Each round runs the synchronous trainer, the asynchronous one (in an
order that alternates) and, right after the synchronous run and before its checkpoints are
removed, `dd if=/dev/zero bs=16M conv=fsync` of one checkpoint's bytes: into new space, as the
saves wrote (a freshly freed extent of a thin-provisioned virtual disk writes much faster).
From each run's metrics.jsonl: the save events (seconds, blocking_s, background_s, gb_per_s)
and the step times of the steps that overlap a background write (the step after each save)
against the others.

    python benchmarks/checkpoint/bench_async.py --rounds 2 --out benchmarks/results
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile

from megatron.base.records import events, read_metrics, steps
from megatron.base.rundir import RunDir

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from bench_io import dd  # noqa: E402

MODEL = ["model.num_layers=8", "model.hidden_size=1024", "model.num_attention_heads=16",
         "model.vocab_size=32000", "model.seq_length=128", "training.micro_batch_size=1",
         "training.global_batch_size=1", "training.train_iters=10", "checkpoint.save_interval=3",
         "training.log_interval=1", "training.tensorboard=false", "parallel.zero_stage=1",
         "eval.eval_interval=0", "training.check_memory=false"]
SAVE_EVERY = 3


def train(run_dir: str, async_save: bool) -> dict:
    exe = os.path.join(os.path.dirname(sys.executable), "megatron-train")
    sets = [x for item in MODEL + [f"run.dir={run_dir}",
                                   f"checkpoint.async_save={str(async_save).lower()}"]
            for x in ("--set", item)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE",
                                                          "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([exe, "--config", os.path.join(ROOT, "examples/local/tiny.yaml"),
                           *sets], capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"megatron-train failed:\n{proc.stderr[-3000:]}")
    records = read_metrics(RunDir(run_dir).metrics)
    saves = events(records, "save")
    times = {r.step: r.step_time_s for r in steps(records)}
    after = [times[s.step + 1] for s in saves if s.step + 1 in times]
    others = [t for step, t in times.items()
              if step > 1 and (step - 1) % SAVE_EVERY != 0]  # step 1 is the warm-up
    return {"saves": [{"at": s.step, "total": s.seconds, "blocked": s.blocking_s,
                       "writer": s.background_s, "size_gb": s.gb, "rate_gbps": s.gb_per_s}
                      for s in saves],
            "step_after_save_s": after, "other_steps_s": others}


def summarise(rounds) -> dict:
    sync = [s for r in rounds for s in r["sync"]["saves"]]
    asyn = [s for r in rounds for s in r["async"]["saves"]]
    med = statistics.median
    out = {"sync_save_s": med(s["total"] for s in sync),
           "sync_gb_per_s": med(s["rate_gbps"] for s in sync),
           "async_blocking_s": med(s["blocked"] for s in asyn),
           "async_background_s": med(s["writer"] for s in asyn),
           "dd_gb_per_s": med(r["dd_gb_per_s"] for r in rounds),
           "async_step_after_save_s": med(t for r in rounds for t in r["async"]
                                          ["step_after_save_s"]),
           "async_other_steps_s": med(t for r in rounds for t in r["async"]["other_steps_s"]),
           "sync_other_steps_s": med(t for r in rounds for t in r["sync"]["other_steps_s"])}
    out["blocking_over_sync"] = out["async_blocking_s"] / out["sync_save_s"]
    out["sync_over_dd"] = out["sync_gb_per_s"] / out["dd_gb_per_s"]
    return out


def table(rounds, summary) -> str:
    lines = ["| round | mode | save step | seconds | blocking_s | background_s | GB/s |",
             "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rounds, 1):
        for mode in ("sync", "async"):
            for s in r[mode]["saves"]:
                lines.append(f"| {i} | {mode} | {s['at']} | {s['total']:.2f} | "
                             f"{s['blocked']:.3f} | {s['writer']:.2f} | "
                             f"{s['rate_gbps']:.2f} |")
        lines.append(f"| {i} | dd conv=fsync | | | | | {r['dd_gb_per_s']:.2f} |")
    lines += ["", "| median | value |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in summary.items()]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dir", default=None, help="where the runs write (default: under .)")
    p.add_argument("--out", default=None, help="folder for checkpoint_async_cpu.json")
    a = p.parse_args()
    work = os.path.abspath(tempfile.mkdtemp(prefix="bench-async-", dir=a.dir or "."))
    rounds = []
    try:
        for i in range(a.rounds):
            r = {}
            order = ("sync", "async") if i % 2 == 0 else ("async", "sync")
            for mode in order:
                run = os.path.join(work, f"{mode}{i}")
                r[mode] = train(run, mode == "async")
                gb = r[mode]["saves"][0]["size_gb"]
                if mode == "sync":  # into new space as the saves were, not the space they held
                    r["dd_gb_per_s"] = dd(work, int(gb * 1e9)) / 1e9
                for name in os.listdir(work):
                    path = os.path.join(work, name)
                    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
            rounds.append(r)
            print(json.dumps(r), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = summarise(rounds)
    print(table(rounds, summary))
    if a.out:
        with open(os.path.join(a.out, "checkpoint_async_cpu.json"), "w") as f:
            json.dump({"machine": platform.processor() or platform.machine(), "rounds": rounds,
                       "median": summary}, f, indent=1)


if __name__ == "__main__":
    main()
