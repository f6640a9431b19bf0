"""Worker for tests/distributed/test_training_groups_left.py: trains several tiny runs one after
another in this process (as a sweep would) and writes, after each, how many gloo threads this
process holds (/proc/self/task/*/comm) on every rank (a pipeline's last stage held more
than its first), written by rank 0.

    torchrun --nproc_per_node 2 tests/support/groups_left_worker.py --out r.json --workdir d \
        --layouts pp2,pp2,tp2
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import torch.distributed as dist

from megatron.config import load_config
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
    if int(os.environ.get("RANK", "0")) == 0:
        with open(args.out, "w") as f:
            json.dump({"gloo_threads_after": after}, f)
    return 0


if __name__ == "__main__":
    exit_after(main)
