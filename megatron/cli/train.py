"""megatron-train: train a GPT model from a YAML config plus --set overrides."""
from __future__ import annotations

import argparse
import logging
import sys

from megatron.cli.common import entry_point, setup_logging
from megatron.config.plugins import load_plugins
from megatron.config import InputError, load_config, reference, validate_for_world
from megatron.launch.env import LaunchEnv, discover
from megatron.launch.startup import StartupTimer
from megatron.planner import fit
from megatron.planner.host_memory import host_memory
from megatron.training.run_paths import check_own_config, check_run_paths, started_in

log = logging.getLogger("megatron.train")

EPILOG = """examples:
  # one process on the CPU, the tiny reference model on synthetic tokens
  megatron-train --config examples/local/tiny.yaml

  # 4 ranks: tensor parallel 2 x pipeline parallel 2
  torchrun --nproc_per_node 4 $(which megatron-train) --config examples/local/tiny.yaml \\
      --set parallel.tensor_parallel_size=2 --set parallel.pipeline_parallel_size=2

  # under Slurm (one task per GPU); the rendezvous comes from SLURM_* variables
  srun python -m megatron.cli.train --config recipe.yaml --set run.dir=runs/$SLURM_JOB_ID

  # resume the run in run.dir from its newest complete checkpoint
  megatron-train --config runs/tiny/config.yaml --set checkpoint.load=auto

  # the same run continued on 4 ranks as TP2 x PP2: weights, Adam moments, step, schedule
  # and data position carry over (any layout of the same model)
  torchrun --nproc_per_node 4 $(which megatron-train) --config runs/tiny/config.yaml \\
      --set checkpoint.load=auto --set parallel.tensor_parallel_size=2 \\
      --set parallel.pipeline_parallel_size=2

  # a model predicted not to fit the device's memory is refused before it is built;
  # this starts it anyway (a warning names the prediction)
  megatron-train --config big.yaml --set training.check_memory=false

  # start another run from a run's weights only (fresh optimizer, step 0)
  megatron-convert to-single --run-dir runs/tiny --output tiny.pt
  megatron-train --config examples/local/tiny.yaml --set run.dir=runs/tiny-pp2 \\
      --set parallel.pipeline_parallel_size=2 --set checkpoint.init_from=tiny.pt
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="megatron-train", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML file with sections model, parallel, training, eval, "
                   "checkpoint, resilience, optimizer, data, kernels, run, deepspeed (unknown "
                   "keys are errors; --help-config lists every field)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value; repeatable")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="import MODULE first: it registers model variants, pipeline schedules "
                   "or fused ops that --set may then name; added to run.plugins, so the run's "
                   "config.yaml brings it to resuming, megatron-generate, megatron-convert and "
                   "megatron-plan (repeatable; MEGATRON_PLUGINS=a,b imports for every command "
                   "of a job without recording)")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config and exit without training")
    p.add_argument("--help-config", nargs="?", const="", metavar="SECTION",
                   help="print every config field (type, default, choices, meaning) of SECTION, "
                   "or of all sections, and exit; the same as docs/config.md")
    return p.parse_args(argv)


def device_memory(launch: LaunchEnv):
    """This rank's device memory (fit.DeviceMemory): a GPU's total, or the CPU's available
    memory shared by the ranks on this node under every limit the job runs under (cgroups,
    RLIMIT_AS); None where it cannot be read. torch is loaded."""
    from megatron.launch.device import detect_device
    info = detect_device(launch.local_rank)
    if info.is_gpu:
        import torch
        total = float(torch.cuda.get_device_properties(info.device).total_memory)
        return fit.DeviceMemory("gpu", total, f"{info.name}, {total / fit.GIB:.1f} GB")
    return host_memory(launch.ranks_per_node)


def check_memory(cfg, launch: LaunchEnv) -> None:
    """Refuses a job predicted not to fit before anything is allocated (training.check_memory
    false: a warning); a config the planner cannot model is let through with a note."""
    memory = device_memory(launch)
    if memory is None:
        log.info("memory check skipped: this machine's memory is unknown")
        return
    verdict = fit.check(cfg, launch.world_size, memory)
    if verdict.status == fit.UNKNOWN:
        log.info("memory check skipped: %s", verdict.reason)
    elif verdict.status == fit.FITS:
        log.info("memory check: predicted %.2f GB per rank of %.1f GB (%s)", verdict.needed_gb,
                 verdict.available_gb, memory.source)
        edge = fit.edge_note(verdict)
        if edge:
            log.warning(edge)
    elif cfg.training.check_memory:
        raise InputError(fit.misfit_message(cfg, verdict) + "; to start anyway, --set "
                         "training.check_memory=false")
    else:
        log.warning("training.check_memory=false, starting anyway: %s",
                    fit.misfit_message(cfg, verdict))


@entry_point("megatron-train")
def main(argv=None) -> int:
    timer = StartupTimer()  # from this process's launch
    timer.mark("python and CLI")
    args = parse_args(argv)
    launch = discover()
    setup_logging(launch.rank)
    load_plugins(args.plugin)
    if args.help_config is not None:  # after the plugins: their registered names are choices
        sys.stdout.write(reference.text(args.help_config or None))
        return 0
    cfg = load_config(args.config, args.set)
    # recorded in the run's config.yaml: resuming and the other commands import them too
    cfg.run.plugins = list(dict.fromkeys([*cfg.run.plugins, *map(str.strip, args.plugin)]))
    if args.print_config:
        sys.stdout.write(cfg.to_yaml())
        return 0
    # The layout checks again here, before torch is imported or a process group joined, so a
    # mistake costs a fraction of a second and every rank stops alike instead of mid-rendezvous.
    validate_for_world(cfg, launch.world_size)
    check_own_config(args.config, args.set, cfg)  # a run's config.yaml from another folder
    # training.startup checks again, for callers of train()
    check_run_paths(cfg, started_in(args.config))
    from megatron.training.loop import train  # torch, DeepSpeed's dependencies, the model
    from megatron.launch.device import leave_distributed
    timer.mark("imports")
    check_memory(cfg, launch)
    timer.mark("memory check")
    summary = train(cfg, startup=timer)
    leave_distributed()
    loss = f"{summary.losses[-1]:.4f}" if summary.losses else "n/a (no step trained)"
    log.info("done: %d steps, final loss %s, run directory %s", summary.steps, loss,
             summary.run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
