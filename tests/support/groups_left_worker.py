"""Worker for tests/distributed/test_training_groups_left.py: trains several tiny runs one after
another in this process (as a sweep would) and writes, after each, how many gloo threads this
process holds (/proc/self/task/*/comm) on every rank (a pipeline's last stage held more
than its first), written by rank 0.

    torchrun --nproc_per_node 2 tests/support/groups_left_worker.py --out r.json --workdir d \\
        --layouts pp2,pp2,tp2
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import torch
import torch.distributed as dist

from megatron.config import load_config
from megatron.launch.startup import StartupTimer
from megatron.training import startup
from megatron.training.loop import train

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, when run by path
from worker_exit import exit_after  # noqa: E402
from paths import TINY  # noqa: E402
from threads import gloo_threads  # noqa: E402

COMMON = ["training.precision=fp32", "training.train_iters=2", "training.global_batch_size=4",
          "training.micro_batch_size=2", "training.tensorboard=false",
          "model.attention_backend=sdpa"]
LAYOUTS = {
    "pp2": ["parallel.pipeline_parallel_size=2"],
    "pp2_zbh1": ["parallel.pipeline_parallel_size=2", "parallel.pipeline_schedule=zbh1"],
    "tp2": ["parallel.tensor_parallel_size=2"],
    "dp2_zero1": ["parallel.zero_stage=1"],
    "dp2_zero3": ["parallel.zero_stage=3"],
    "cp2": ["parallel.context_parallel_size=2", "parallel.zero_stage=0"],
    "ep2": ["model.moe.num_experts=2", "model.moe.top_k=1", "parallel.expert_parallel_size=2"],
    "pp2v2": ["parallel.pipeline_parallel_size=2", "parallel.pipeline_schedule=interleaved",
              "parallel.virtual_pipeline_size=2"],
}


def overlapping(workdir: str) -> list:
    """Two jobs alive at once, as an A/B comparison that steps two engines in turn: both step
    with the other alive, and the first closes first. Its close must leave the second's groups
    and DeepSpeed's globals working (the second steps after it) and still free its own objects,
    which the second's start froze out of the collector (startup.py). Gloo threads, by stage:
    none of the jobs, the first alive, both, the second alone, none again; whether the first's
    model outlived its close; the two steps' losses."""
    import weakref
    counts = [gloo_threads()]
    jobs = []
    for i in range(2):
        cfg = load_config(TINY, COMMON + LAYOUTS["pp2"] + [f"run.dir={workdir}/overlap{i}"])
        jobs.append(startup.start(cfg, StartupTimer()))
        counts.append(gloo_threads())
    first_loss = jobs[0].engine.train_step(micro_batches(cfg, jobs[0].text_vocab)).loss
    first_model = weakref.ref(jobs[0].model.module)
    jobs[0].close()
    jobs[0] = None
    counts.append(gloo_threads())
    loss = jobs[1].engine.train_step(micro_batches(cfg, jobs[1].text_vocab)).loss  # groups work
    jobs[1].close()
    counts.append(gloo_threads())
    return {"gloo_threads": counts, "first_model_outlived_close": first_model() is not None,
            "losses": [float(first_loss), float(loss)]}


def micro_batches(cfg, vocab: int):
    """Random micro-batches for a started job's engine, as the loop gives them: (tokens,
    labels), the same on every rank."""
    g = torch.Generator().manual_seed(0)
    b, s = cfg.training.micro_batch_size, cfg.model.seq_length
    while True:
        rows = torch.randint(0, vocab, (b, s + 1), generator=g)
        yield rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--layouts", required=True)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    after = []
    for i, layout in enumerate(args.layouts.split(",")):
        run_dir = os.path.join(args.workdir, f"run{i}-{layout}")
        summary = train(load_config(TINY, COMMON + LAYOUTS[layout] + [f"run.dir={run_dir}"]))
        assert summary.steps == 2, summary.steps
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, gloo_threads())  # over the world's group, which stays
        after.append([layout, every])
    overlap = [None] * dist.get_world_size()
    dist.all_gather_object(overlap, overlapping(args.workdir))
    if int(os.environ.get("RANK", "0")) == 0:
        with open(args.out, "w") as f:
            json.dump({"gloo_threads_after": after, "overlap": overlap}, f)
    return 0


if __name__ == "__main__":
    exit_after(main)
