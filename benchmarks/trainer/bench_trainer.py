#!/usr/bin/env python3
"""The trainer's own overhead: megatron-train against a plain PyTorch loop and Hugging Face
transformers on the same work, in one run, alternating; then parallel efficiency on 2 cores and
start-up time to the first step.

    python benchmarks/trainer/bench_trainer.py [--out DIR] [--rounds 5] [--tiny]
        [--sections single,layouts,startup] [--layouts tp2,pp2,dp2] [--startup-ranks 1,4]

Sections (facts.py holds what the programs share):
- single: the issue's GPT-2-shaped model (4 layers, hidden 256, 4 heads, sequence 256,
  vocabulary 8192, batch 8; 5.3M parameters), fp32, one thread, AdamW, clipping 1.0. Programs:
  megatron (the trainer, TP=PP=1, ZeRO-0, synthetic tokens), plain (peer_plain.py: nn.Linear,
  F.scaled_dot_product_attention, F.cross_entropy) and hf (peer_hf.py: GPT2LMHeadModel, SDPA).
  Each round runs every program once, each in a fresh process, in an order that rotates from
  round to round. A program's tokens/s is the tokens of a step over the median of its whole-loop
  iteration times after the warm-up; ratios are the trainer's tokens/s over a peer's in the same
  round; reported as median and range over rounds, in wall time and in process CPU time (the
  latter is less sensitive to other work on the machine).
- layouts: examples/local/tiny.yaml on one process (one thread) and under TP2, PP2, DP2 (two
  ranks, one thread each, torchrun); efficiency = tokens/s of the two ranks / (2 x tokens/s of
  one process), per round. tiny.yaml trains with ZeRO-1; single_zero0 and dp2_zero0 show what
  DeepSpeed's ZeRO-1 bookkeeping costs at this size.
- startup: megatron-train as a user runs it (one process, and torchrun with 4 ranks as
  TP2 x PP2) for one step on tiny.yaml; the phases from launch to the first step that the run
  logs (and writes into its first metrics line), and the launcher's share (torchrun). Alternating
  with it, the same run with the engine's stand-ins for DeepSpeed's Muon modules switched off
  (train_without_stand_ins.py: how ZeRO runs started before them). The first step of the single
  section's peers gives the same measure for plain PyTorch and transformers.

Other people's jobs share the development machine: each run first waits (up to --quiet-wait s)
for the rest of the machine to be idle, and a run during which other processes used more than
0.15 cores on average is run once more, keeping the quieter of the two (each result records
what it saw under "quiet"). Beside the per-round medians, the tables give ratios of each
program's best round: other work only ever slows a run down.

Writes DIR/trainer_overhead.json and DIR/trainer_overhead_tables.md (default
benchmarks/results) after every section. --tiny: a tiny shape, one round, few steps (the test).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import facts  # noqa: E402
from megatron.base.records import read_metrics, steps  # noqa: E402
from megatron.base.rundir import RunDir  # noqa: E402
import report  # noqa: E402

PROGRAMS = ("megatron", "plain", "hf")
PEERS = ("plain", "hf")
# name: (ranks, overrides of tiny.yaml). A name's suffix after "_" (e.g. dp2_zero0) compares it
# with the one-process run of the same suffix (single_zero0).
LAYOUTS = {"single": (1, []), "tp2": (2, ["parallel.tensor_parallel_size=2"]),
           "pp2": (2, ["parallel.pipeline_parallel_size=2"]), "dp2": (2, []),
           "single_zero0": (1, ["parallel.zero_stage=0"]),
           "dp2_zero0": (2, ["parallel.zero_stage=0"])}
TINY_YAML = "examples/local/tiny.yaml"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"),
                   help="directory for trainer_overhead.json and trainer_overhead_tables.md")
    p.add_argument("--name", default="trainer_overhead", help="file name stem of the results")
    p.add_argument("--rounds", type=int, default=5, help="rounds of the single section")
    p.add_argument("--layout-rounds", type=int, default=3, help="rounds of the layouts section")
    p.add_argument("--startup-rounds", type=int, default=3, help="launches per start-up case")
    p.add_argument("--sections", default="single,layouts,startup",
                   help="comma-separated: single, layouts, startup, profile")
    p.add_argument("--layouts", default="tp2,pp2,dp2",
                   help=f"two-rank layouts to measure, of: {', '.join(LAYOUTS)}")
    p.add_argument("--startup-ranks", default="1,4", help="rank counts of the start-up section")
    p.add_argument("--warmup", type=int, default=3, help="single: steps not timed")
    p.add_argument("--steps", type=int, default=10, help="single: timed steps per run")
    p.add_argument("--layout-warmup", type=int, default=5)
    p.add_argument("--layout-steps", type=int, default=25)
    p.add_argument("--timeout", type=float, default=900, help="seconds per process")
    p.add_argument("--quiet-wait", type=float, default=120.0,
                   help="seconds to wait at most before each run for the rest of the machine to be "
                   "idle (0: do not wait)")
    p.add_argument("--merge", action="store_true",
                   help="keep the other sections of an existing DIR/NAME.json (rerun one section)")
    p.add_argument("--tiny", action="store_true",
                   help="tiny shape, one round, few steps: checks the benchmark runs (the test)")
    args = p.parse_args(argv)
    if args.tiny:
        args.quiet_wait = 0.0
        args.rounds = args.layout_rounds = args.startup_rounds = 1
        args.warmup, args.steps, args.layout_warmup, args.layout_steps = 1, 2, 1, 2
    return args


# ---------------------------------------------------------------------------------- running


def _worker_cmd(ranks: int) -> List[str]:
    if ranks == 1:
        return [sys.executable, str(HERE / "worker.py")]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
            "--standalone", str(HERE / "worker.py")]


def _cpu_ticks():
    """(all CPU time, idle CPU time) of the machine so far, in seconds (Linux /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    return sum(fields) / hz, (fields[3] + fields[4]) / hz  # idle + iowait


def _busy_cores(seconds: float = 1.0) -> float:
    """Cores' worth of CPU time used on the machine over `seconds`."""
    total0, idle0 = _cpu_ticks()
    time.sleep(seconds)
    total1, idle1 = _cpu_ticks()
    return (os.cpu_count() or 1) * (1.0 - (idle1 - idle0) / max(1e-9, total1 - total0))


# Other people's jobs share this machine. Before each run: wait up to max_wait_s (--quiet-wait)
# for the rest of the machine to use under busy_cores. After it: a run during which other
# processes used more than foreign_cores on average is run again once, keeping the quieter one.
QUIET = {"max_wait_s": 120.0, "busy_cores": 0.3, "foreign_cores": 0.15}


def _wait_for_quiet() -> dict:
    waited, start = 0.0, time.time()
    busy = _busy_cores() if QUIET["max_wait_s"] > 0 else 0.0
    while busy > QUIET["busy_cores"] and waited < QUIET["max_wait_s"]:
        time.sleep(4.0)
        busy = _busy_cores()
        waited = time.time() - start
    return {"busy_cores_before": round(busy, 2), "waited_s": round(waited, 1)}


def _run(cmd: List[str], log: Path, timeout: float) -> Dict[str, float]:
    """Runs cmd (one thread per process) with its output in `log`, after waiting for quiet.
    Returns when it was launched and how many cores other processes used meanwhile (the
    machine's busy CPU time less this run's: its processes are this one's only children).
    A failure raises with the log's tail."""
    info = _wait_for_quiet()
    with open(log, "w") as f:
        children0, (total0, idle0) = resource.getrusage(resource.RUSAGE_CHILDREN), _cpu_ticks()
        launched = time.time()
        proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                              env=facts.one_thread_env(), timeout=timeout)
        wall = time.time() - launched
        children1, (total1, idle1) = resource.getrusage(resource.RUSAGE_CHILDREN), _cpu_ticks()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... failed ({proc.returncode}):\n"
                           f"{log.read_text()[-3000:]}")
    ours = sum(getattr(children1, k) - getattr(children0, k) for k in ("ru_utime", "ru_stime"))
    busy = (total1 - total0) - (idle1 - idle0)
    info.update(launched_at=launched, foreign_cores=round(max(0.0, busy - ours) / wall, 3))
    return info


def _attempts(tag: str, launch) -> dict:
    """launch(suffix) -> result dict with "quiet" info. One retry when the run fails (a gloo
    rank can abort at interpreter exit after a finished run: "terminate called without an
    active exception", rare, seen under heavy load); one more run when other processes took
    more than QUIET["foreign_cores"] meanwhile, keeping the run with less foreign load."""
    def once(suffix):
        try:
            return launch(suffix)
        except RuntimeError as e:
            print(f"{tag}{suffix} failed, retrying once: {str(e).splitlines()[-1][:200]}",
                  flush=True)
            return dict(launch(suffix + "_retry"), retried_after=str(e)[-2000:])
    out = once("")
    if out["quiet"]["foreign_cores"] > QUIET["foreign_cores"] and QUIET["max_wait_s"] > 0:
        again = once("_again")
        out, dropped = sorted((out, again), key=lambda r: r["quiet"]["foreign_cores"])
        out["quiet"]["disturbed_run_dropped"] = dropped["quiet"]["foreign_cores"]
    return out


def run_program(program: str, work: Path, tag: str, steps: int, timeout: float,
                shape: Optional[facts.Shape] = None, ranks: int = 1, config: str = None,
                overrides=(), profile: Optional[Path] = None) -> dict:
    def launch(suffix):
        result = work / f"{tag}{suffix}.json"
        cmd = _worker_cmd(ranks) + ["--program", program, "--steps", str(steps),
                                    "--result", str(result)]
        if shape is not None:
            cmd += ["--shape", json.dumps(shape.as_dict())]
        if config:
            cmd += ["--config", config]
        if program == "megatron":
            cmd += ["--run-dir", str(work / f"{tag}{suffix}_run")]
        for item in overrides:
            cmd += ["--set", item]
        if profile is not None:
            cmd += ["--profile", str(profile)]
        info = _run(cmd, work / f"{tag}{suffix}.log", timeout)
        return dict(json.loads(result.read_text()), launched_at=info.pop("launched_at"),
                    quiet=info)
    return _attempts(tag, launch)


def _spread(values: List[float]) -> Dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def _rates(raw: dict, warmup: int, tokens: int) -> dict:
    """tokens/s from the median whole-iteration time after `warmup`, wall and CPU."""
    wall = raw["iteration_times"][warmup:]
    cpu = raw["iteration_cpu_times"][warmup:]
    out = {"tokens_per_s": tokens / statistics.median(wall),
           "cpu_tokens_per_s": tokens / statistics.median(cpu),
           "median_iteration_s": statistics.median(wall),
           "iteration_times_s": [round(t, 4) for t in raw["iteration_times"]],
           "first_loss": raw["losses"][0], "last_loss": raw["losses"][-1]}
    if raw.get("first_step_at") and raw.get("launched_at"):
        out["launch_to_first_step_s"] = raw["first_step_at"] - raw["launched_at"]
    for key in ("retried_after", "quiet"):
        if raw.get(key):
            out[key] = raw[key]
    out["wall_over_cpu"] = statistics.median(wall) / statistics.median(cpu)
    return out


# ---------------------------------------------------------------------------------- sections


def section_single(args, work: Path, shape: facts.Shape) -> dict:
    steps = args.warmup + args.steps
    rounds = []
    for r in range(args.rounds):
        order = PROGRAMS[r % 3:] + PROGRAMS[:r % 3]
        entry = {"order": list(order)}
        for program in order:
            raw = run_program(program, work, f"single_r{r}_{program}", steps, args.timeout,
                              shape=shape)
            entry[program] = _rates(raw, args.warmup, shape.tokens_per_step)
            print(f"single round {r + 1}/{args.rounds} {program}: "
                  f"{entry[program]['tokens_per_s']:.0f} tokens/s", flush=True)
        rounds.append(entry)
    return {"shape": shape.as_dict(), "tokens_per_step": shape.tokens_per_step,
            "warmup_steps": args.warmup, "timed_steps": args.steps, "rounds": rounds,
            **report.single_summary(rounds, PROGRAMS, PEERS)}


def _layout_names(args) -> List[str]:
    """The requested layouts, each after the one-process run it is compared with."""
    names = []
    for name in ["single"] + [x for x in args.layouts.split(",") if x]:
        if name not in LAYOUTS:
            raise SystemExit(f"unknown layout {name!r}: {', '.join(LAYOUTS)}")
        for n in (report.baseline_of(name), name):
            if n not in names:
                names.append(n)
    return names


def section_layouts(args, work: Path) -> dict:
    names = _layout_names(args)
    steps = args.layout_warmup + args.layout_steps
    rounds = []
    for r in range(args.layout_rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        entry = {"order": order}
        for name in order:
            ranks, overrides = LAYOUTS[name]
            raw = run_program("megatron", work, f"layout_r{r}_{name}", steps, args.timeout,
                              ranks=ranks, config=TINY_YAML, overrides=overrides)
            entry[name] = dict(_rates(raw, args.layout_warmup, raw["tokens_per_step"]),
                               layout=raw["layout"])
            print(f"layouts round {r + 1}/{args.layout_rounds} {name}: "
                  f"{entry[name]['tokens_per_s']:.0f} tokens/s", flush=True)
        rounds.append(entry)
    return {"config": TINY_YAML, "warmup_steps": args.layout_warmup,
            "timed_steps": args.layout_steps, "rounds": rounds,
            **report.layout_summary(rounds, names)}


# Start-up variants: as the CLI runs now, and with the engine's stand-ins for DeepSpeed's Muon
# modules switched off (how every ZeRO or bf16 run started before them).
STARTUP_VARIANTS = {"megatron-train": ["-m", "megatron.cli.train"],
                    "without the Muon stand-ins": [str(HERE / "train_without_stand_ins.py")]}


def _startup_once(work: Path, tag: str, ranks: int, variant: str, timeout: float) -> dict:
    def launch(suffix):
        run_dir = work / f"{tag}{suffix}_run"
        cmd = [sys.executable] if ranks == 1 else \
            [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
             "--standalone"]
        cmd += STARTUP_VARIANTS[variant] + ["--config", TINY_YAML, "--set",
                                            "training.train_iters=1", "--set", f"run.dir={run_dir}"]
        if ranks == 4:
            cmd += ["--set", "parallel.tensor_parallel_size=2",
                    "--set", "parallel.pipeline_parallel_size=2"]
        info = _run(cmd, work / f"{tag}{suffix}.log", timeout)
        first = steps(read_metrics(RunDir(str(run_dir)).metrics))[0]
        startup = first.startup
        return {"launch_to_first_step_s": startup.first_step_at - info.pop("launched_at"),
                "rank0_process_to_first_step_s": startup.total_s,
                "phases": startup.phases, "first_step_s": startup.first_step_s,
                "quiet": info}
    return _attempts(tag, launch)


def section_startup(args, work: Path) -> dict:
    """Each rank count, each variant once per round, alternating."""
    out = {"config": TINY_YAML, "cases": {}}
    variants = list(STARTUP_VARIANTS) if not args.tiny else ["megatron-train"]
    for ranks in [int(x) for x in args.startup_ranks.split(",") if x]:
        runs = {v: [] for v in variants}
        for r in range(args.startup_rounds):
            for i, variant in enumerate(variants[r % 2:] + variants[:r % 2]):
                tag = f"startup_{ranks}_r{r}_{i}"
                runs[variant].append(_startup_once(work, tag, ranks, variant, args.timeout))
                print(f"startup {ranks} rank(s) {r + 1}/{args.startup_rounds} {variant}: "
                      f"{runs[variant][-1]['launch_to_first_step_s']:.2f} s", flush=True)
        for variant in variants:
            key = str(ranks) if variant == "megatron-train" else f"{ranks} without stand-ins"
            out["cases"][key] = dict(report.startup_summary(runs[variant]), ranks=ranks,
                                     variant=variant)
    return out


def section_profile(args, work: Path, shape: facts.Shape) -> dict:
    """torch.profiler tables (steps 4-6, rank 0) of each program and layout, into DIR/profiles."""
    where = Path(args.out) / "profiles"
    done = {}
    for program in PROGRAMS:
        target = where / f"single_{program}"
        run_program(program, work, f"profile_{program}", 7, args.timeout, shape=shape,
                    profile=target)
        done[f"single_{program}"] = str(target / "profile.txt")
    for name in _layout_names(args):
        target = where / f"tiny_{name}"
        ranks, overrides = LAYOUTS[name]
        run_program("megatron", work, f"profile_tiny_{name}", 7, args.timeout, ranks=ranks,
                    config=TINY_YAML, overrides=overrides, profile=target)
        done[f"tiny_{name}"] = str(target / "profile.txt")
    return done


# ---------------------------------------------------------------------------------- main


def machine() -> dict:
    import torch
    info = {"platform": platform.platform(), "python": platform.python_version(),
            "cores": os.cpu_count(), "torch": torch.__version__, "threads_per_process": 1}
    for name in ("deepspeed", "transformers"):
        try:
            info[name] = __import__(name).__version__
        except Exception as e:  # reported, not fatal: the section that needs it fails later
            info[name] = f"unavailable ({type(e).__name__})"
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in f
                               if line.startswith("model name"))
    except (OSError, StopIteration):
        info["cpu"] = platform.processor()
    return info


def main(argv=None) -> int:
    args = parse_args(argv)
    QUIET["max_wait_s"] = args.quiet_wait
    shape = facts.TINY if args.tiny else facts.ISSUE
    sections = [s for s in args.sections.split(",") if s]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "trainer_overhead", "tiny": args.tiny,
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": machine(), "load_average_start": os.getloadavg()}
    previous = out_dir / f"{args.name}.json"
    if args.merge and previous.exists():
        kept = json.loads(previous.read_text())
        result = dict(kept, **result, merged_from=kept.get("date"))
    with tempfile.TemporaryDirectory(prefix="bench_trainer_") as tmp:
        work = Path(tmp)
        for name in sections:
            load = os.getloadavg()[0]
            if name == "single":
                result["single"] = section_single(args, work, shape)
            elif name == "layouts":
                result["layouts"] = section_layouts(args, work)
            elif name == "startup":
                result["startup"] = section_startup(args, work)
            elif name == "profile":
                result["profiles"] = section_profile(args, work, shape)
                continue
            else:
                raise SystemExit(f"unknown section {name!r}: single, layouts, startup, profile")
            # Other work on the machine shows here: the 1-minute load average around the section.
            result[name].update(date=result["date"], load_average=[load, os.getloadavg()[0]])
            result["load_average_end"] = os.getloadavg()
            report.write(result, out_dir, args.name)
    print(report.markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
