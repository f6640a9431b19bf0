"""Worker for the zero-bubble schedule's tests and benchmark: run under torchrun, starts each
requested case twice in this one process launch, with parallel.pipeline_schedule=1f1b and =zbh1
(the engine built by training.startup, which sets zbh1 up through its runner,
engine.zero_bubble.use_zero_bubble), trains both on the same synthetic
micro-batches and writes per-step losses, gradient norms and step times as JSON (rank 0).

    torchrun --nproc_per_node 2 tests/support/zero_bubble_worker.py --out r.json \\
        --cases pp2-gpt2,pp2-llama --workdir /tmp/zb

--alternate N: benchmark mode; the two engines stay built and their steps alternate N times
(1f1b, zbh1, 1f1b, ...), so both see the same machine load."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import torch

from megatron.config import load_config
from megatron.data.synthetic import SyntheticTokens
from megatron.launch.startup import StartupTimer
from megatron.training import startup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, when run by path
from worker_exit import exit_after  # noqa: E402
from paths import TINY  # noqa: E402
from run_layouts import FLAVOURS  # noqa: E402  (GPT-2 and Llama: one home)

COMMON = ["training.precision=fp32", "training.global_batch_size=16",
          "training.micro_batch_size=2", "training.tensorboard=false", "training.clip_grad=1.0",
          "model.hidden_dropout=0.0", "model.attention_dropout=0.0", "model.attention_backend=sdpa",
          "optimizer.lr=0.003", "optimizer.lr_warmup_iters=2"]
LAYOUTS = {
    "pp2": ["parallel.pipeline_parallel_size=2"],
    "pp2_zero0": ["parallel.pipeline_parallel_size=2", "parallel.zero_stage=0"],
    "pp2_bf16": ["parallel.pipeline_parallel_size=2", "training.precision=bf16"],
    "pp2_recompute_full": ["parallel.pipeline_parallel_size=2",
                           "training.activation_checkpointing=full"],
    "pp2_recompute_selective": ["parallel.pipeline_parallel_size=2",
                                "model.attention_backend=math",
                                "training.activation_checkpointing=selective"],
    "pp4": ["parallel.pipeline_parallel_size=4"],
    "tp2pp2": ["parallel.pipeline_parallel_size=2", "parallel.tensor_parallel_size=2"],
    "tp2pp2_sp": ["parallel.pipeline_parallel_size=2", "parallel.tensor_parallel_size=2",
                  "parallel.sequence_parallel=true"],
    # the benchmark's shapes: a model whose passes take milliseconds, not microseconds
    "bench": ["parallel.pipeline_parallel_size=2", "parallel.zero_stage=0",
              "model.hidden_size=256", "model.seq_length=128", "model.num_layers=4",
              "model.num_attention_heads=8", "model.vocab_size=2048"],
}


def batches(cfg, vocab: int):
    """The same micro-batches for every engine: (tokens [b, s], labels [b, s])."""
    stream = SyntheticTokens(vocab, cfg.model.seq_length, cfg.training.seed)
    b, i = cfg.training.micro_batch_size, 0
    while True:
        rows = torch.from_numpy(__import__("numpy").stack(
            [stream.sample(i + k) for k in range(b)]))
        i += b
        yield rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def build(overrides, run_dir: str, schedule: str):
    cfg = load_config(TINY, overrides + [f"run.dir={run_dir}",
                                         f"parallel.pipeline_schedule={schedule}"])
    job = startup.start(cfg, StartupTimer())
    # The engine's runner (engine/runners.py) already set ZB-H1 up: count the weights it gave
    # to its store rather than apply it a second time.
    store = getattr(job.engine.engine, "zb_store", None)
    job.deferred = sum(1 for p in job.model.module.parameters()
                       if store is not None and getattr(p, "wgrad_store", None) is store)
    return cfg, job


def train(cfg, job, steps: int):
    it = batches(cfg, job.text_vocab)
    losses, norms, times = [], [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        r = job.engine.train_step(it)
        times.append(time.perf_counter() - t0)
        losses.append(r.loss)
        norms.append(r.grad_norm)
    store = getattr(job.engine.engine, "zb_store", None)
    return {"losses": losses, "grad_norms": norms, "step_s": times,
            "deferred_layers": getattr(job, "deferred", 0),
            "b_passes_last_step": store.sealed() if store else 0,
            "w_pending": store.pending() if store else 0}


def alternate(cfg_jobs, rounds: int, steps: int):
    """Steps of the engines in turn, `steps` each per round: {schedule: [seconds...]}."""
    its = {name: batches(cfg, job.text_vocab) for name, (cfg, job) in cfg_jobs.items()}
    times = {name: [] for name in cfg_jobs}
    for _ in range(rounds):
        for name, (cfg, job) in cfg_jobs.items():
            for _ in range(steps):
                torch.distributed.barrier()
                t0 = time.perf_counter()
                job.engine.train_step(its[name])
                times[name].append(time.perf_counter() - t0)
    return times


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--cases", required=True, help="layout-flavour,...")
    p.add_argument("--workdir", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--alternate", type=int, default=0, help="benchmark rounds")
    p.add_argument("--set", action="append", default=[], help="extra overrides")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results = {}
    for case in args.cases.split(","):
        layout, flavour = case.split("-")
        overrides = COMMON + FLAVOURS[flavour] + LAYOUTS[layout] + args.set
        if args.alternate:  # both engines alive, stepped in turn
            built = {s: build(overrides, os.path.join(args.workdir, f"{case}-{s}"), s)
                     for s in ("1f1b", "zbh1")}
            results[case] = alternate(built, args.alternate, args.steps)
            for _, job in reversed(list(built.values())):  # the last built first
                job.close()
            continue
        results[case] = {}
        for s in ("1f1b", "zbh1"):  # one engine at a time: each job closed before the next
            cfg, job = build(overrides, os.path.join(args.workdir, f"{case}-{s}"), s)
            results[case][s] = train(cfg, job, args.steps)
            job.close()  # the run directory, and the process groups with their gloo threads
    if int(os.environ.get("RANK", "0")) == 0:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    exit_after(main)
