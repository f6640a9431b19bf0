"""megatron-train: train a GPT model from a YAML config plus --set overrides."""
from __future__ import annotations

import argparse
import logging
import sys

from megatron.cli.common import entry_point, setup_logging
from megatron.config import load_config, validate_for_world
from megatron.launch.env import discover
from megatron.launch.startup import StartupTimer

EPILOG = """examples:
  # one process on the CPU, the tiny reference model on synthetic tokens
  megatron-train --config examples/local/tiny.yaml

  # 4 ranks: tensor parallel 2 x pipeline parallel 2
  torchrun --nproc_per_node 4 $(which megatron-train) --config examples/local/tiny.yaml \\
      --set parallel.tensor_parallel_size=2 --set parallel.pipeline_parallel_size=2

  # under Slurm (one task per GPU); the rendezvous comes from SLURM_* variables
  srun python -m megatron.cli.train --config recipe.yaml --set run.dir=runs/$SLURM_JOB_ID

  # resume the run in run.dir from its newest complete checkpoint
  megatron-train --config runs/tiny/config.yaml --set training.load=auto

  # the same run continued on 4 ranks as TP2 x PP2: weights, Adam moments, step, schedule
  # and data position carry over (any layout of the same model)
  torchrun --nproc_per_node 4 $(which megatron-train) --config runs/tiny/config.yaml \\
      --set training.load=auto --set parallel.tensor_parallel_size=2 \\
      --set parallel.pipeline_parallel_size=2

  # start another run from a run's weights only (fresh optimizer, step 0)
  megatron-convert to-single --run-dir runs/tiny --output tiny.pt
  megatron-train --config examples/local/tiny.yaml --set run.dir=runs/tiny-pp2 \\
      --set parallel.pipeline_parallel_size=2 --set training.init_from=tiny.pt
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="megatron-train", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML file with sections model, parallel, training, "
                   "optimizer, data, kernels, run, deepspeed (unknown keys are errors)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value; repeatable")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config and exit without training")
    return p.parse_args(argv)


@entry_point("megatron-train")
def main(argv=None) -> int:
    timer = StartupTimer()  # from this process's launch
    timer.mark("python and CLI")
    args = parse_args(argv)
    launch = discover()
    setup_logging(launch.rank)
    cfg = load_config(args.config, args.set)
    if args.print_config:
        sys.stdout.write(cfg.to_yaml())
        return 0
    # The layout checks again here, before torch is imported or a process group joined, so a
    # mistake costs a fraction of a second and every rank stops alike instead of mid-rendezvous.
    validate_for_world(cfg, launch.world_size)
    from megatron.training.loop import train  # torch, DeepSpeed's dependencies, the model
    from megatron.launch.device import leave_distributed
    timer.mark("imports")
    summary = train(cfg, startup=timer)
    leave_distributed()
    logging.getLogger("megatron.train").info(
        "done: %d steps, final loss %.4f, run directory %s", summary.steps,
        summary.losses[-1] if summary.losses else float("nan"), summary.run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
