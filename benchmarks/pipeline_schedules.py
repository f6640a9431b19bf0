"""Pipeline schedules against 1F1B on this machine: PP4 on 4 CPU ranks (gloo), interleaved 1F1B
with v = 2, ZB-H1 and ZB-V against DeepSpeed's 1F1B, at m = 4 and m = 8 micro-batches per step.
Every engine (4 schedules x 2 values of m) is built in one launch and their steps alternate, a
barrier before each, so load from other work on the machine falls on all of them alike; min and
median step times are reported, and each schedule's ratio to 1F1B at the same m.

Next to them, what each schedule predicts, from its record and its own order:
- the closed-form bubble of its record (config/schedules: (p - 1)/(m + p - 1) for 1F1B,
  (p - 1)/(v m + p - 1) interleaved, ZB-H1's and ZB-V's with W a third of a stage's time);
- the step ratio its order replays to with a rank per core (interleaved_order.replay,
  v_order.replay, pipe_order.makespan; F = 1, B = 2 per stage, B = W = 1 for the split
  backward);
- the same with the machine's cores shared by the ranks: a step takes at least the work of every
  rank divided by the cores (3 m p units over `cores`), which hides the bubble when there are
  fewer cores than ranks.

With --device-gflops R every TP-layer GEMM also sleeps its time at R GFLOP/s, in the pass that
computes it (MEGATRON_TEST_DEVICE_GFLOPS, megatron/base/faults.py): each rank then waits as it
would on an accelerator, without holding a core, so a rank with nothing to do idles and the
bubbles show even with more ranks than cores. What is measured is then the schedules' real
order, point-to-point exchange and dependencies over an emulated device time; the attention
products, norms and the rest still compute on the shared cores, unemulated.

    .venv/bin/python benchmarks/pipeline_schedules.py [--rounds 4] [--steps 2] [--keep]
        [--device-gflops R]
    # writes benchmarks/results/pipeline_schedules.{json,md} (with --device-gflops
    # pipeline_schedules_device.{json,md}); --keep appends to earlier runs
Run under torchrun with --worker it is the worker (4 ranks)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from megatron.config import schedules  # noqa: E402
from megatron.config.schedules.registry import Pipe  # noqa: E402
from megatron.engine import interleaved_order, pipe_order, v_order  # noqa: E402

OUT = os.path.join(ROOT, "benchmarks", "results")
TINY = os.path.join(ROOT, "examples", "local", "tiny.yaml")
P, V, MICRO_BATCHES = 4, 2, (4, 8)
# Passes of tens of milliseconds per layer, so the bubble outweighs the point-to-point traffic
# (a [256, 2, 256] fp32 activation, 512 KB, per chunk boundary and micro-batch).
MODEL = ["model.num_layers=8", "model.hidden_size=256", "model.num_attention_heads=8",
         "model.seq_length=256", "model.vocab_size=2048", "model.hidden_dropout=0.0",
         "model.attention_dropout=0.0", "model.attention_backend=sdpa",
         "training.micro_batch_size=2", "training.precision=fp32", "training.train_iters=1000",
         "training.tensorboard=false", "parallel.zero_stage=1",
         f"parallel.pipeline_parallel_size={P}"]
SCHEDULES = {
    "1f1b": ["parallel.pipeline_schedule=1f1b"],
    "interleaved": ["parallel.pipeline_schedule=interleaved",
                    f"parallel.virtual_pipeline_size={V}"],
    "zbh1": ["parallel.pipeline_schedule=zbh1"],
    "zbv": ["parallel.pipeline_schedule=zbv", "parallel.virtual_pipeline_size=2"],
}


# --- the worker (4 ranks under torchrun) ----------------------------------------------------------

def _batches(cfg, vocab: int):
    import numpy as np
    import torch
    from megatron.data.synthetic import SyntheticTokens
    stream = SyntheticTokens(vocab, cfg.model.seq_length, cfg.training.seed)
    b, i = cfg.training.micro_batch_size, 0
    while True:
        rows = torch.from_numpy(np.stack([stream.sample(i + k) for k in range(b)]))
        i += b
        yield rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def worker(out: str, workdir: str, rounds: int, steps: int) -> int:
    import logging

    import torch.distributed as dist
    from megatron.config import load_config
    from megatron.launch.startup import StartupTimer
    from megatron.training import startup
    logging.basicConfig(level=logging.WARNING)
    jobs = {}
    for m in MICRO_BATCHES:
        for name, sets in SCHEDULES.items():
            cfg = load_config(TINY, MODEL + sets + [f"training.global_batch_size={2 * m}",
                                                   f"run.dir={workdir}/{name}-m{m}"])
            job = startup.start(cfg, StartupTimer())
            jobs[(name, m)] = (job, _batches(cfg, job.text_vocab))
    times = {key: [] for key in jobs}
    losses = {key: [] for key in jobs}
    for _ in range(rounds):
        for key, (job, it) in jobs.items():
            for _ in range(steps):
                dist.barrier()
                t0 = time.perf_counter()
                result = job.engine.train_step(it)
                times[key].append(time.perf_counter() - t0)
                losses[key].append(result.loss)
    for job, _ in jobs.values():
        if job.lock:
            job.lock.release()
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({f"{name}/{m}": {"step_s": times[(name, m)], "losses": losses[(name, m)]}
                       for name, m in jobs}, f, indent=1)
    from megatron.launch.device import leave_distributed
    leave_distributed()
    return 0


# --- predictions ---------------------------------------------------------------------------------

def predicted(name: str, m: int, cores: int) -> dict:
    """The record's closed-form bubble, and the replayed step in units of one stage's forward,
    alone (a core per rank) and with `cores` cores shared by the P ranks."""
    if name == "interleaved":
        step = interleaved_order.replay(P, V, m, [{interleaved_order.F: 1.0 / V,
                                                    interleaved_order.B: 2.0 / V}] * P)
        bubble = schedules.get(name).bubble(Pipe(P, m, V), 0.0)
    elif name == "zbv":  # a chunk pass is half a stage's: F = B = W = 1/2
        step = v_order.replay(P, m, [{v_order.F: 0.5, v_order.B: 0.5, v_order.W: 0.5}] * P)
        bubble = schedules.get(name).bubble(Pipe(P, m, 2), 1 / 3)
    elif name == "zbh1":
        step = pipe_order.makespan(name, P, m, [{"F": 1.0, "B": 1.0, "W": 1.0}] * P)
        bubble = schedules.get(name).bubble(Pipe(P, m), 1 / 3)
    else:
        step = pipe_order.makespan(name, P, m, [{"F": 1.0, "B": 2.0}] * P)
        bubble = schedules.get(name).bubble(Pipe(P, m), 0.0)
    shared = max(step, 3.0 * m * P / cores)
    return {"bubble": bubble, "step_units": step, "step_units_shared": shared}


# --- the driver ----------------------------------------------------------------------------------

def launch(rounds: int, steps: int, device_gflops: float = 0.0) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={P}",
               "--standalone", os.path.abspath(__file__), "--worker", "--out", out,
               "--workdir", tmp, "--rounds", str(rounds), "--steps", str(steps)]
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        if device_gflops:
            from megatron.base.faults import DEVICE_GFLOPS_VAR
            env[DEVICE_GFLOPS_VAR] = str(device_gflops)
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
        if proc.returncode:
            sys.stderr.write(proc.stderr[-5000:])
            raise SystemExit(f"the {P}-rank launch failed ({proc.returncode})")
        with open(out) as f:
            return json.load(f)


def summarise(raw: dict, cores: int) -> list:
    rows = []
    for m in MICRO_BATCHES:
        base = None
        for name in SCHEDULES:
            t = sorted(raw[f"{name}/{m}"]["step_s"][1:])  # each engine's first step warms up
            pred = predicted(name, m, cores)
            row = {"schedule": name, "pp": P, "m": m, "v": 1 if name in ("1f1b", "zbh1") else V,
                   "median_s": statistics.median(t), "min_s": t[0], "steps": len(t), **pred}
            base = base or row
            row["ratio_median"] = row["median_s"] / base["median_s"]
            row["ratio_min"] = row["min_s"] / base["min_s"]
            row["predicted_ratio"] = pred["step_units"] / base["step_units"]
            row["predicted_ratio_shared"] = pred["step_units_shared"] / base["step_units_shared"]
            rows.append(row)
    return rows


def table(run: dict) -> str:
    rows, cores, load = run["rows"], run["cores"], run["load_average"]
    device = (f", an emulated device of {run['device_gflops']:g} GFLOP/s per rank"
              if run.get("device_gflops") else "")
    lines = [f"## {run.get('when', 'a run')}: load average (1, 5, 15 min) {load[0]:.1f}, "
             f"{load[1]:.1f}, {load[2]:.1f} at the start, {run.get('seconds', 0):.0f} s{device}",
             "",
             "| m | schedule | median s | min s | ratio (median) | ratio (min) | "
             "bubble (closed form) | predicted ratio, a core per rank | "
             f"predicted ratio, {cores} cores |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = {"interleaved": f"interleaved v{r['v']}", "zbv": "ZB-V",
                "zbh1": "ZB-H1", "1f1b": "1F1B"}[r["schedule"]]
        lines.append(f"| {r['m']} | {name} | {r['median_s']:.3f} | {r['min_s']:.3f} | "
                     f"{r['ratio_median']:.3f} | {r['ratio_min']:.3f} | {r['bubble']:.3f} | "
                     f"{r['predicted_ratio']:.3f} | {r['predicted_ratio_shared']:.3f} |")
    return "\n".join(lines) + "\n"


HEADER = (f"# Pipeline schedules against 1F1B, PP{P} on {P} CPU ranks (gloo)\n\n"
          "benchmarks/pipeline_schedules.py: GPT-2 flavour, 8 layers, hidden 256, 8 heads, "
          "seq 256, micro-batch 2, vocabulary 2048, fp32, ZeRO-1; one launch per run, every "
          "engine's steps alternated (a barrier before each), the first step of each left out. "
          "Each run is appended (newest first). The machine's cores are shared with other "
          "work: the load average says how much. Predicted ratios: each schedule's own order "
          "replayed (F = 1, B = 2 a stage; B = W = 1 split), with a core per rank, and with "
          "the ranks sharing the machine's cores (a step is then at least all ranks' work over "
          "the cores, which hides every bubble when there are fewer cores than ranks).\n")


DEVICE_HEADER = (f"# Pipeline schedules against 1F1B, PP{P} on {P} CPU ranks (gloo) with an emulated "
                 "device\n\n"
                 "benchmarks/pipeline_schedules.py --device-gflops R: the model and method of "
                 "pipeline_schedules.md, and every TP-layer GEMM also sleeps its multiply-adds' "
                 "time at R GFLOP/s in the pass that computes it (forward, input gradient, weight "
                 "gradient: a deferred W carries its own), so a rank waits as on an accelerator "
                 "without holding a core and an idle rank idles. Measured: the schedules' real "
                 "order, exchange and dependencies; the attention products, norms, loss and "
                 "optimizer still compute on the shared cores. Compare with the predicted "
                 "ratio with a core per rank (each schedule's order replayed, F = 1, B = 2 a "
                 "stage, B = W = 1 split).\n")


def _runs(path: str) -> list:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        old = json.load(f)
    return old["runs"] if "runs" in old else [old]  # a file of one run, before runs were kept


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out")
    ap.add_argument("--workdir")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2, help="steps of an engine per round")
    ap.add_argument("--keep", action="store_true",
                    help="keep the earlier runs in results/ (newest first)")
    ap.add_argument("--device-gflops", type=float, default=0.0,
                    help="emulate a device of this many GFLOP/s per rank (module docstring)")
    args = ap.parse_args()
    if args.worker:
        return worker(args.out, args.workdir, args.rounds, args.steps)
    cores, load, t0 = os.cpu_count() or 1, os.getloadavg(), time.time()
    rows = summarise(launch(args.rounds, args.steps, args.device_gflops), cores)
    name = "pipeline_schedules_device" if args.device_gflops else "pipeline_schedules"
    path = os.path.join(OUT, f"{name}.json")
    run = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0)), "cores": cores,
           "load_average": load, "seconds": time.time() - t0, "rounds": args.rounds,
           "steps": args.steps, "device_gflops": args.device_gflops, "rows": rows}
    runs = [run] + (_runs(path) if args.keep else [])
    with open(path, "w") as f:
        json.dump({"runs": runs}, f, indent=1)
    header = DEVICE_HEADER if args.device_gflops else HEADER
    text = header + "\n" + "\n".join(table(r) for r in runs)
    with open(os.path.join(OUT, f"{name}.md"), "w") as f:
        f.write(text)
    print(table(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
