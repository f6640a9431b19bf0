"""Worker for the interleaved schedule's tests: run under torchrun, trains each requested case
twice in this one launch, with parallel.pipeline_schedule=1f1b (DeepSpeed's PipelineEngine,
one stage per rank) and =interleaved (engine/interleaved.py, virtual_pipeline_size chunks per
rank), on the same micro-batches (zero_bubble_worker.batches), and writes per-step losses, gradient norms, parameter names and
the weights' dtype as JSON (rank 0).

    torchrun --nproc_per_node 2 tests/support/interleaved_worker.py --out r.json \\
        --cases pp2v2-gpt2 --workdir /tmp/vpp"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from megatron.config import load_config
from megatron.launch.startup import StartupTimer
from megatron.training import startup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, when run by path
from worker_exit import exit_after  # noqa: E402
from paths import TINY  # noqa: E402
from run_layouts import FLAVOURS  # noqa: E402  (GPT-2 and Llama: one home)
from zero_bubble_worker import COMMON, batches  # noqa: E402

LAYOUTS = {
    "pp2v2": ["parallel.pipeline_parallel_size=2"],
    "pp4v2": ["parallel.pipeline_parallel_size=4", "model.num_layers=8"],
    "tp2pp2v2": ["parallel.pipeline_parallel_size=2", "parallel.tensor_parallel_size=2"],
    "pp2v2bf16": ["parallel.pipeline_parallel_size=2", "training.precision=bf16"],
    "pp4v2bf16": ["parallel.pipeline_parallel_size=4", "model.num_layers=8",
                  "training.precision=bf16"],
    # ZB-V (two chunks per rank in a V), against 1F1B on the same stages
    "pp2zbv": ["parallel.pipeline_parallel_size=2"],
    "pp4zbv": ["parallel.pipeline_parallel_size=4", "model.num_layers=8"],
    "tp2pp2zbv": ["parallel.pipeline_parallel_size=2", "parallel.tensor_parallel_size=2"],
    "pp2bf16zbv": ["parallel.pipeline_parallel_size=2", "training.precision=bf16"],
    # uneven model chunks (first and last chunk 1 layer of 6: chunks [1, 2, 2, 1]) against 1F1B
    # on even stages: where the layers sit does not change the arithmetic
    "pp2v2u": ["parallel.pipeline_parallel_size=2", "model.num_layers=6"],
    "pp2uzbv": ["parallel.pipeline_parallel_size=2", "model.num_layers=6"],
    # the embedding and the head counted as a layer each (Llama 3's split): 2 layers on 2 x 2
    # chunks [0, 1, 1, 0], the end chunks the embedding alone and the head alone; under ZB-V
    # rank 0 holds both and no transformer layer
    "pp2v2e": ["parallel.pipeline_parallel_size=2", "model.num_layers=2"],
    "pp2ezbv": ["parallel.pipeline_parallel_size=2", "model.num_layers=2"],
    # micro-batch counts that are not a multiple of the stages, run in groups
    # (parallel.pipeline_microbatch_group): 5 on 2 stages in groups of 3 (the last one 2), 6 on
    # 4 stages in one group of 6
    "pp2v2g3": ["parallel.pipeline_parallel_size=2", "training.global_batch_size=10"],
    "pp4v2g6": ["parallel.pipeline_parallel_size=4", "model.num_layers=8",
                "training.global_batch_size=12"],
}
# overrides of the chunked run only (1F1B's stages stay even)
CHUNKED_ONLY = {name: ["parallel.pipeline_first_stage_layers=1",
                       "parallel.pipeline_last_stage_layers=1"] for name in ("pp2v2u", "pp2uzbv")}
CHUNKED_ONLY.update({name: ["parallel.pipeline_embedding_as_layer=true",
                            "parallel.pipeline_loss_as_layer=true"]
                     for name in ("pp2v2e", "pp2ezbv")})
CHUNKED_ONLY.update({"pp2v2g3": ["parallel.pipeline_microbatch_group=3"],
                     "pp4v2g6": ["parallel.pipeline_microbatch_group=6"]})


def chunked_schedule(layout: str) -> str:
    """The schedule a case compares with 1F1B: zbv for the *zbv layouts, else interleaved."""
    return "zbv" if layout.endswith("zbv") else "interleaved"


def schedule_overrides(schedule: str):
    if schedule == "1f1b":
        return ["parallel.pipeline_schedule=1f1b"]
    return [f"parallel.pipeline_schedule={schedule}", "parallel.virtual_pipeline_size=2"]


def train(overrides, run_dir: str, steps: int):
    cfg = load_config(TINY, overrides + [f"run.dir={run_dir}"])
    job = startup.start(cfg, StartupTimer())
    it = batches(cfg, job.text_vocab)
    losses, norms = [], []
    for _ in range(steps):
        r = job.engine.train_step(it)
        losses.append(r.loss)
        norms.append(r.grad_norm)
    params = job.engine.named_parameters()
    executor = getattr(job.engine.engine, "interleaved", None)
    result = {"losses": losses, "grad_norms": norms, "names": sorted(name for name, _ in params),
              "dtype": str(params[0][1].dtype), "clip": cfg.training.clip_grad,
              # TP layers whose weight gradients wait for a W pass (ZB-V's executor)
              "deferred": getattr(executor, "deferred", 0) if executor else 0,
              # the micro-batches a chunk takes in a row, where the order groups them
              "group": getattr(getattr(executor, "order", None), "group", 0)}
    del params, executor
    job.close()  # the run directory, and the process groups with their gloo threads
    return result


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--cases", required=True, help="layout-flavour,...")
    p.add_argument("--workdir", required=True)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results = {}
    for case in args.cases.split(","):
        layout, flavour = case.split("-")
        base = COMMON + FLAVOURS[flavour] + LAYOUTS[layout]
        chunked = chunked_schedule(layout)
        results[case] = {s: train(base + schedule_overrides(s)
                                  + (CHUNKED_ONLY.get(layout, []) if s == chunked else []),
                                  os.path.join(args.workdir, f"{case}-{s}"), args.steps)
                         for s in ("1f1b", chunked)}
    if int(os.environ.get("RANK", "0")) == 0:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    exit_after(main)
