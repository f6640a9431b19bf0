"""Worker for tests/distributed/test_checkpoint_moe.py, in the launches shared with the other
distributed modules (tests/support/launch_batches.py), or alone:

    torchrun --nproc_per_node 4 tests/support/moe_checkpoint_worker.py --out r.json \\
        --workdir /tmp/w --sources ep4_zero1 --targets ep4_zero1>ep2_zero0 --single ep4_zero1

Each --sources layout trains 10 steps, saving at step 5 (rank 0 writes the losses of steps 6-10
and the first); each --targets `src>dst` continues src's step-5 checkpoint in dst to step 10;
--single merges a source's checkpoint into one file (megatron-convert to-single), which each
--inits `src:dst` starts a fresh run of dst from (its first loss). Every job shares --workdir.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, when run by path
from moe import MOE  # noqa: E402
from paths import TINY  # noqa: E402
from worker_exit import exit_after  # noqa: E402

# the router bias (kept in the checkpoint, on pipeline stages too) and a shared expert
BIAS = ["model.moe.router_bias_update_rate=0.01", "model.moe.shared_expert_ffn_hidden_size=48"]
ZBV = ["parallel.pipeline_schedule=zbv", "parallel.virtual_pipeline_size=2"]
LAYOUTS = {
    "ep4_zero0": ["parallel.expert_parallel_size=4", "parallel.zero_stage=0"],
    "ep4_zero1": ["parallel.expert_parallel_size=4", "parallel.zero_stage=1"],
    "ep2_zero1": ["parallel.expert_parallel_size=2", "parallel.zero_stage=1"],
    "ep2_zero0": ["parallel.expert_parallel_size=2", "parallel.zero_stage=0"],
    # experts over the TP ranks (sequence parallel), two data-parallel replicas ...
    "ep2_tp2_dp2": ["parallel.expert_parallel_size=2", "parallel.tensor_parallel_size=2",
                    "parallel.sequence_parallel=true", "parallel.zero_stage=1", *BIAS],
    # ... continued on two pipeline stages instead
    "ep2_tp2_pp2": ["parallel.expert_parallel_size=2", "parallel.tensor_parallel_size=2",
                    "parallel.sequence_parallel=true", "parallel.pipeline_parallel_size=2",
                    "parallel.zero_stage=1", *BIAS],
    # ... or on two stages of two model chunks each in ZB-V's V (engine/interleaved.py)
    "ep2_tp2_pp2_zbv": ["parallel.expert_parallel_size=2", "parallel.tensor_parallel_size=2",
                        "parallel.sequence_parallel=true", "parallel.pipeline_parallel_size=2",
                        "parallel.zero_stage=1", *ZBV, *BIAS],
    # saved from model chunks (rank 0 holds layers 0 and 3, rank 1 layers 1 and 2; each
    # writes its own MoE layer's router bias)
    "ep2_pp2_zbv": ["parallel.expert_parallel_size=2", "parallel.pipeline_parallel_size=2",
                    "parallel.zero_stage=1", *ZBV, *BIAS],
    "one": [],
    "one_bias": BIAS,
}


def _config(layout: str, run_dir: str, *extra: str):
    from megatron.config import load_config
    return load_config(TINY, MOE + LAYOUTS[layout] + [f"run.dir={run_dir}", "checkpoint.save=true",
                                                      *extra])


def _rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"  # before train() has a process group too


def _published(path: str, aside: str, write) -> None:
    """Rank 0 writes `aside` (write(aside)) and renames it to `path`; the other ranks wait for
    `path`, so none reads it part-written."""
    if _rank0():
        write(aside)
        os.rename(aside, path)
    while not os.path.exists(path):
        time.sleep(0.1)


def _target(workdir: str, src: str, dst: str):
    from megatron.training.loop import train
    new = os.path.join(workdir, f"{src}-to-{dst}")
    step = os.path.join(workdir, src, "checkpoints", "step_0000005")
    _published(new, new + ".part", lambda aside: shutil.copytree(
        step, os.path.join(aside, "checkpoints", "step_0000005")))
    summary = train(_config(dst, new, "checkpoint.load=auto"))
    assert summary.steps == 10, summary.steps
    return summary.losses


def _single(workdir: str, src: str) -> None:
    """megatron-convert to-single of `src`'s newest checkpoint into <workdir>/<src>.pt."""
    from megatron.checkpoint.convert import convert_to_single
    path = os.path.join(workdir, f"{src}.pt")
    _published(path, path + ".part.pt",
               lambda aside: convert_to_single(os.path.join(workdir, src), aside))


def _init(workdir: str, src: str, dst: str) -> float:
    """The first loss of a fresh run at layout `dst` from <workdir>/<src>.pt."""
    from megatron.training.loop import train
    run = os.path.join(workdir, f"{src}-init-{dst}")
    cfg = _config(dst, run, f"checkpoint.init_from={os.path.join(workdir, src + '.pt')}",
                  "training.train_iters=1", "checkpoint.save=false")
    return train(cfg).losses[0]


def _worker(out: str, workdir: str, sources, targets, single=None, inits=()) -> int:
    from megatron.training.loop import train
    results = {}
    for src in sources:
        cfg = _config(src, os.path.join(workdir, src), "checkpoint.save_interval=5")
        losses = train(cfg).losses
        results[src], results[f"{src}/first"] = losses[5:], losses[0]
    for case in targets:
        results[case] = _target(workdir, *case.split(">"))
    if single:
        _single(workdir, single)
    for case in inits:
        results[case] = _init(workdir, *case.split(":"))
    if _rank0():
        with open(out, "w") as f:
            json.dump(results, f)
    return 0


def _names(text: str) -> list:
    return list(filter(None, text.split(",")))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--sources", default="")
    p.add_argument("--targets", default="")
    p.add_argument("--single", default=None)
    p.add_argument("--inits", default="")
    args = p.parse_args()
    return _worker(args.out, args.workdir, _names(args.sources), _names(args.targets),
                   args.single, _names(args.inits))


if __name__ == "__main__":
    exit_after(main)
