#!/usr/bin/env python3
"""One benchmark program in a process of its own: the trainer (megatron), or a peer (plain, hf).

    python worker.py --program plain --shape '{"layers": 4, ...}' --steps 13 --result r.json
    python worker.py --program megatron --shape '{...}' --steps 13 --result r.json
    torchrun --nproc_per_node 2 worker.py --program megatron --config examples/local/tiny.yaml \\
        --set parallel.tensor_parallel_size=2 --steps 20 --result r.json

The trainer runs as megatron-train does (config, logging, megatron.training.loop.train) in this
process, so its own RunSummary gives the whole-iteration times; rank 0 writes the result.
--profile DIR: a torch.profiler table of steps 4-6 (rank 0) into DIR/profile.txt."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import facts  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--program", choices=("megatron", "plain", "hf"), required=True)
    p.add_argument("--shape", help="JSON of facts.Shape (the single-process comparison)")
    p.add_argument("--config", help="megatron: a YAML config instead of --shape")
    p.add_argument("--set", action="append", default=[], help="megatron: extra overrides")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--run-dir", default=None, help="megatron: run.dir (default: a temp dir)")
    p.add_argument("--result", required=True, help="JSON file for the result (rank 0)")
    p.add_argument("--profile", default=None, help="directory for a torch.profiler table")
    return p.parse_args(argv)


def _profiler(directory):
    """A torch.profiler stepped once per iteration, recording steps 4-6, or None."""
    if not directory:
        return None
    from torch.profiler import ProfilerActivity, profile, schedule
    prof = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=3, warmup=1,
                                                                          active=3))
    prof.start()
    return prof


def _write_profile(prof, directory, rank: int) -> None:
    if prof is None:
        return
    prof.stop()
    if rank == 0:
        Path(directory).mkdir(parents=True, exist_ok=True)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
        (Path(directory) / "profile.txt").write_text(table + "\n")


def run_peer(args) -> dict:
    import torch
    torch.set_num_threads(1)
    shape = facts.Shape(**json.loads(args.shape))
    module = __import__(f"peer_{args.program}")
    model, loss_fn = module.build(shape)
    prof = _profiler(args.profile)
    if prof is not None:
        inner = loss_fn

        def loss_fn(m, tokens, labels):  # steps the profiler once per iteration
            prof.step()
            return inner(m, tokens, labels)
    import peer_loop
    out = peer_loop.train(model, loss_fn, shape, args.steps)
    _write_profile(prof, args.profile, 0)
    return out


def run_megatron(args) -> dict:
    import tempfile
    import torch
    torch.set_num_threads(1)
    from megatron.cli.common import setup_logging
    from megatron.config import load_config
    from megatron.launch.env import discover
    rank = discover().rank
    setup_logging(rank)
    run_dir = args.run_dir or tempfile.mkdtemp(prefix="bench_trainer_")
    overrides = [] if args.shape is None else facts.megatron_overrides(
        facts.Shape(**json.loads(args.shape)), args.steps, run_dir)
    overrides += [f"training.train_iters={args.steps}", f"run.dir={run_dir}",
                  "training.tensorboard=false", *args.set]
    cfg = load_config(args.config, overrides)
    from megatron.training import loop
    prof = _profiler(args.profile)
    if prof is not None:
        step = loop._Loop._train_step

        def stepped(self):
            prof.step()
            return step(self)
        loop._Loop._train_step = stepped
    summary = loop.train(cfg)
    _write_profile(prof, args.profile, rank)
    import torch.distributed as dist
    layout = {"world": dist.get_world_size(), "tp": cfg.parallel.tensor_parallel_size,
              "pp": cfg.parallel.pipeline_parallel_size, "zero": cfg.parallel.zero_stage,
              "micro_batch": cfg.training.micro_batch_size,
              "global_batch": cfg.training.global_batch_size}
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    timing = summary.timing
    return {"iteration_times": timing.iteration_s,
            "iteration_cpu_times": timing.iteration_cpu_s, "losses": summary.losses,
            "startup": timing.startup, "first_step_at": timing.startup.get("first_step_at"),
            "tokens_per_step": cfg.training.global_batch_size * cfg.model.seq_length,
            "layout": layout, "rank": rank}


def main(argv=None) -> int:
    args = parse_args(argv)
    out = run_megatron(args) if args.program == "megatron" else run_peer(args)
    out["program"] = args.program
    if out.get("rank", 0) == 0:
        tmp = args.result + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f)
        os.replace(tmp, args.result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
