"""python -m megatron.cli.chain: the batch scripts' entry point to chained Slurm jobs
(megatron/training/chain.py has the rules; examples/frontier/chain.sh calls this)."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Optional, Sequence

from megatron.config import environ
from megatron.base.rundir import RunDir
from megatron.config import load_config
from megatron.cli.common import count, entry_point, integer
from megatron.training.run_paths import check_own_config
from megatron.training.chain import (ATTEMPT, SCRIPT, begin, end, excluded_nodes, progress,
                                     read_env_file, rollback_start, settings, submit_next,
                                     _where)

EPILOG = """examples:
  # where a run stands: its resolved config names run.dir and training.train_iters
  python -m megatron.cli.chain status --config runs/175b/config.yaml

  # begin and end are called by batch scripts through examples/frontier/chain.sh
"""


def _parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m megatron.cli.chain",
                                description=__doc__.split("\n")[0], epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    helps = {"status": "print the run's newest complete step and whether it is finished",
             "begin": "before training: print 'train STEP' or 'stop STEP' (run finished)",
             "end": "after training: submit the batch script again if the chain goes on"}
    for name, text in helps.items():
        c = sub.add_parser(name, help=text)
        c.add_argument("--config", help="the run's YAML config, as given to megatron-train")
        c.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="the same overrides as given to megatron-train")
        if name == "end":
            c.add_argument("--start-step", type=count(0), required=True,
                           help="the step printed by begin")
            c.add_argument("--exit-status", type=integer, required=True,
                           help="the training step's exit status (for the log)")
            c.add_argument("--submit-env", required=True,
                           help="`env -0` of the job before env.sh was sourced")
            c.add_argument("script_args", nargs="*",
                           help="after --: the batch script's own arguments")
    return p.parse_args(argv)


@entry_point("chain")
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse(argv)
    env = os.environ
    cfg = load_config(args.config, args.set)
    check_own_config(args.config, args.set, cfg)  # status --config <run dir>/config.yaml
    p = progress(cfg.run.dir, cfg.training.train_iters)
    for line in p.skipped:
        _say(f"skipped (does not validate): {line}")
    if args.command == "status":
        print(f"{_where(p)}: {'finished' if p.finished else 'not finished'}")
        return 0
    s = settings(env, cfg.checkpoint.save)
    if args.command == "begin":
        unknown = environ.unknown_note(env)  # a misspelt MEGATRON_CHAIN_* would do nothing
        if unknown:
            _say(unknown)
        p = rollback_start(p, cfg.checkpoint.load, cfg.checkpoint.roll_back)
        d = begin(p, s)
        _say(d.message)
        print(f"{'train' if d.go else 'stop'} {p.step}")
        return 0
    d = end(p, args.start_step, args.exit_status, s)
    _say(d.message)
    _record(cfg.run.dir, env, d.message)
    if d.go:
        exclude = excluded_nodes(RunDir(cfg.run.dir).read_bad_nodes(), env)
        if exclude:
            _say(f"leaving out the node(s) named in bad_nodes: {', '.join(exclude)}")
        job = submit_next(env["SLURM_JOB_ID"], args.script_args,
                          read_env_file(args.submit_env), s.attempt, env.get(SCRIPT), d.failures,
                          exclude)
        _say(f"submitted job {job} ({ATTEMPT}={s.attempt + 1}), to start when this one "
             "ends")
    return 0


def _record(run_dir: str, env, message: str) -> None:
    """The decision in <run.dir>/chain.log with its job and nodes (skipped if it cannot be
    written: the job's output has the line too)."""
    line = (f"{time.strftime('%Y-%m-%d %H:%M:%S')} job {env.get('SLURM_JOB_ID', '?')} on "
            f"{env.get('SLURM_JOB_NODELIST', '?')}: {message}\n")
    try:
        os.makedirs(run_dir, exist_ok=True)
        with open(RunDir(run_dir).chain_log, "a") as f:
            f.write(line)
    except OSError as e:
        _say(f"cannot append to the run's chain log ({e})")


def _say(line: str) -> None:
    sys.stderr.write(f"chain: {line}\n")
    sys.stderr.flush()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="chain: %(message)s")
    sys.exit(main())
