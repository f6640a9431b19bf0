"""Worker for the training-state invariant tests (training/state_check.py), run under torchrun:
each case trains tiny.yaml in this process with the test hook MEGATRON_TEST_STATE_FAULT set for
one rank and step (a flipped exponent in its AdamW moments, weights or reduced gradients), and
records what the run did: the step and error it stopped with, the state_suspect events, the
nodes in bad_nodes and the newest complete checkpoint's step (saves every step). Rank 0 writes
`<case>` -> {"error", "events", "bad_nodes", "checkpoint_step", "losses"}.

    torchrun --nproc_per_node 4 tests/support/state_check_worker.py --out r.json \\
        --workdir /tmp/w --cases grad_zero0_dp4,exp_avg_zero2_dp4
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from megatron.base import faults
from megatron.base.records import events, read_metrics
from megatron.base.rundir import RunDir
from megatron.config import load_config
from megatron.training.loop import train
from megatron.training.state_check import StateCorruption

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, when run by path
from worker_exit import exit_after  # noqa: E402
from paths import TINY  # noqa: E402

COMMON = ["training.train_iters=4", "training.global_batch_size=8", "training.micro_batch_size=1",
          "training.tensorboard=false", "training.save_interval=1", "model.num_layers=2",
          "optimizer.lr=0.003", "optimizer.lr_warmup_iters=1"]
FP32 = ["training.precision=fp32"]

# name: (fault "RANK:STEP:TARGET:FACTOR", settings) on 4 ranks
CASES = {
    # ZeRO-0: each rank updates its own replica; a reduced gradient bent on one rank moves its
    # weights alone, and three replicas outvote it
    "grad_zero0_dp4": ("2:2:grad:1e6", FP32 + ["parallel.zero_stage=0"]),
    "param_zero1_dp4": ("1:3:param:1e6", FP32 + ["parallel.zero_stage=1"]),
    # ZeRO 1-3: the moments of the rank's own shard (DeepSpeed's flat partitions)
    "exp_avg_zero2_dp4": ("3:2:exp_avg:1e20", FP32 + ["parallel.zero_stage=2"]),
    "exp_avg_sq_zero3_dp4": ("0:3:exp_avg_sq:1e-20", FP32 + ["parallel.zero_stage=3"]),
    # bf16 under ZeRO-0: DeepSpeed's bf16 optimizer holds fp32 masters and their moments
    "exp_avg_bf16_dp4": ("1:2:exp_avg:1e20", ["training.precision=bf16",
                                              "parallel.zero_stage=0"]),
    # pipelined: DeepSpeed's pipeline engine steps; the check follows its update
    "exp_avg_tp2pp2": ("3:2:exp_avg:-1e20", FP32 + ["parallel.tensor_parallel_size=2",
                                                    "parallel.pipeline_parallel_size=2"]),
    # two replicas (TP2 x DP2): which of them is wrong is not known; both are named
    "param_tp2dp2_zero0": ("1:2:param:1e6", FP32 + ["parallel.tensor_parallel_size=2",
                                                    "parallel.zero_stage=0"]),
}


def _case(name: str, workdir: str) -> dict:
    fault, settings = CASES[name]
    run = RunDir(os.path.join(workdir, name))
    os.environ[faults.STATE_FAULT_VAR] = fault
    error = None
    try:
        summary = train(load_config(TINY, COMMON + settings + [f"run.dir={run.path}"]))
        losses = summary.losses
    except StateCorruption as e:
        error, losses = str(e), None
    finally:
        del os.environ[faults.STATE_FAULT_VAR]
    found = [e.__dict__ for e in events(read_metrics(run.metrics), "state_suspect")]
    step = run.continuation().found
    return {"error": error, "events": found, "bad_nodes": run.read_bad_nodes(),
            "checkpoint_step": step.step if step else None, "losses": losses}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--workdir", required=True, help="shared by all ranks (run directories)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results = {name: _case(name, args.workdir) for name in args.cases.split(",")}
    if int(os.environ.get("RANK", "0")) == 0:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    exit_after(main)
