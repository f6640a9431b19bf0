"""What the planner hands a person: a ranked table, a ready config YAML, a Slurm batch script."""
from __future__ import annotations

import dataclasses
import os
import shlex
from typing import Dict, List, Optional

from megatron.config import Config, schedules, validate_for_world, variants
from megatron.config.errors import ConfigError
from megatron.launch import frontier_env
from megatron.planner.hardware import ClusterSpec
from megatron.planner.layout import Job, Layout, run_as
from megatron.planner.search import Candidate

# The paper's optimizer (REFERENCE.md), used when the model comes from a preset.
PAPER_OPTIMIZER = {"lr": 6e-5, "min_lr": 6e-6, "weight_decay": 0.1, "adam_beta1": 0.9,
                   "adam_beta2": 0.95, "lr_decay_style": "cosine"}

HEADER = ("rank", "TP", "PP", "DP", "CP", "mb", "acc", "ZeRO", "recompute", "attn", "SP", "sched",
          "GB/GPU", "step s", "TFLOPs/GPU", "% peak", "HFU %", "bubble %")


def table_rows(cands: List[Candidate]) -> List[List[str]]:
    rows = []
    for i, c in enumerate(cands, 1):
        lay, t = c.layout, c.time
        # DP shows its expert-parallel split where there is one ("16 ep8")
        dp = f"{lay.dp} ep{lay.ep}" if lay.ep > 1 else str(lay.dp)
        cp = str(lay.cp) if lay.cp == 1 or lay.cp_algo == "ulysses" else \
            f"{lay.cp} {lay.cp_label()}"
        # PP shows set end-stage layers ("16 ends 7": 7 on the first and on the last stage;
        # "4 ends -,9": the first as the middle ones, 9 on the last), or the ends counted as
        # a layer ("16 ends emb,loss")
        if lay.stage_counts:  # the engine's own split ("4 split 9/9/8/6")
            ends = "/".join(map(str, lay.stage_counts))
        elif lay.counted:
            ends = ",".join(("emb" if lay.embedding_as_layer else "-",
                             "loss" if lay.loss_as_layer else "-"))
        elif lay.first_stage_layers == lay.last_stage_layers:
            ends = lay.first_stage_layers
        else:
            ends = ",".join("-" if v is None else str(v)
                            for v in (lay.first_stage_layers, lay.last_stage_layers))
        pp = (f"{lay.pp} {'split' if lay.stage_counts else 'ends'} {ends}" if lay.uneven
              else str(lay.pp))
        rows.append([str(i), str(lay.tp), pp, dp, cp,
                     str(lay.micro_batch),
                     str(lay.grad_accum), str(lay.zero), lay.recompute,
                     "flash" if lay.flash else "math", "on" if lay.sequence_parallel else "off",
                     (lay.schedule + (f" v{lay.interleave}" if lay.interleave > 1 else ""))
                     if lay.pp > 1 else "-", f"{c.memory.peak_gb:.1f}", f"{t.step_s:.3g}", f"{t.tflops_per_gpu:.3g}",
                     f"{100 * t.mfu:.1f}", f"{100 * t.hfu:.1f}", f"{100 * t.bubble:.1f}"])
    return _merge_twins(rows)


ZERO_COLUMN = HEADER.index("ZeRO")


def _merge_twins(rows: List[List[str]]) -> List[List[str]]:
    """One row for neighbours that differ in the ZeRO stage alone, every figure shown equal
    (ZeRO-0 and 1 under DeepSpeed's bf16 pipeline engine keep the same sharded optimizer):
    rank "11-12", ZeRO "1/0", in rank order."""
    out: List[List[str]] = []
    for row in rows:
        last = out[-1] if out else None
        if last is not None and all(a == b for k, (a, b) in enumerate(zip(last, row))
                                    if k not in (0, ZERO_COLUMN)):
            last[0] = f"{last[0].split('-')[0]}-{row[0]}"
            last[ZERO_COLUMN] = f"{last[ZERO_COLUMN]}/{row[ZERO_COLUMN]}"
            continue
        out.append(list(row))
    return out


def format_table(header, rows: List[List[str]]) -> str:
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(header)]
    lines = ["  ".join(str(h).rjust(w) for h, w in zip(header, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def layout_config(base: Config, job: Job, lay: Layout, flash_backend: Optional[str] = None,
                  run_dir: Optional[str] = None, paper_optimizer: bool = False) -> Config:
    """`base` with the layout applied; validated for the layout's world size exactly as the
    trainer will validate it (raises ConfigError otherwise)."""
    if schedules.get(lay.schedule).runner is None:
        raise ConfigError("layout", lay.key(), "a schedule this trainer runs (one of "
                          f"{', '.join(schedules.with_runner())})",
                          f"{lay.schedule} is priced for comparison only: no engine runs it")
    if lay.stage_counts:
        raise ConfigError("layout", lay.key(), "a stage split this trainer runs (set first/last "
                          "stage counts, the rest even)", "the split "
                          f"{'/'.join(map(str, lay.stage_counts))} is another engine's "
                          "(--framework nanotron): search under --framework deepspeed to "
                          "write a config")
    raw: Dict[str, Dict] = base.to_dict()
    raw["model"] = dataclasses.asdict(job.model)
    # flash layouts: flash_backend, else the first core that keeps no scores; the others: the
    # core that keeps them (model/attention_cores.py)
    raw["model"]["attention_backend"] = (
        (flash_backend or variants.attention_core(keeps_scores=False).name) if lay.flash
        else variants.attention_core(keeps_scores=True).name)
    schedule = run_as(lay)  # with chunks, 1f1b runs as the interleaved schedule
    raw["parallel"].update(tensor_parallel_size=lay.tp, pipeline_parallel_size=lay.pp,
                           zero_stage=lay.zero, sequence_parallel=lay.sequence_parallel,
                           pipeline_schedule=schedule, virtual_pipeline_size=lay.interleave,
                           context_parallel_size=lay.cp,
                           expert_parallel_size=lay.ep, context_parallel_algo=lay.cp_algo,
                           ulysses_degree=lay.ulysses_degree,
                           pipeline_first_stage_layers=lay.first_stage_layers or 0,
                           pipeline_last_stage_layers=lay.last_stage_layers or 0,
                           pipeline_embedding_as_layer=lay.embedding_as_layer,
                           pipeline_loss_as_layer=lay.loss_as_layer,
                           pipeline_microbatch_group=lay.microbatch_group)
    raw["training"].update(micro_batch_size=lay.micro_batch, global_batch_size=lay.global_batch,
                           precision=job.precision, activation_checkpointing=lay.recompute)
    if paper_optimizer:
        raw["optimizer"].update(PAPER_OPTIMIZER)
        raw["training"]["clip_grad"] = 1.0
    if run_dir:
        raw["run"]["dir"] = run_dir
    cfg = Config.from_dict(raw)
    validate_for_world(cfg, lay.world)
    return cfg


def _schedule_note(name: str) -> str:
    return f"{name} ({schedules.get(name).title})"


def config_yaml(cfg: Config, cand: Candidate, cluster: str, nodes: int) -> str:
    lay, t = cand.layout, cand.time
    note = (f"# Written by megatron-plan for {nodes} node(s) of {cluster}: TP{lay.tp} x PP{lay.pp}"
            f" x DP{lay.dp}{f' x CP{lay.cp}' if lay.cp > 1 else ''}, micro-batch {lay.micro_batch}, {lay.grad_accum} accumulation steps"
            f"{f', pipeline schedule {_schedule_note(lay.schedule)}' if lay.pp > 1 else ''}.\n"
            f"# Predicted: {cand.memory.peak_gb:.1f} GB per GPU at peak, {t.step_s:.3g} s per step,"
            f" {t.tflops_per_gpu:.1f} TFLOPs per GPU ({100 * t.mfu:.1f}% of peak), bubble "
            f"{100 * t.bubble:.1f}%.\n")
    return note + cfg.to_yaml()


MASTER_NOTE = "# MASTER_ADDR, MASTER_PORT: from the step's node list and the job and step ids."


def _frontier_env_lines() -> List[str]:
    """The Frontier environment, the same text as examples/frontier/env.sh, inside a function
    so that its `return 1` on a failed module load stops the script as it would a `source`."""
    return ["# --- Frontier environment: megatron/launch/frontier_env.py "
            "(the text of examples/frontier/env.sh)",
            "_megatron_env() {", frontier_env.env_script().rstrip("\n"), "}", "_megatron_env", ""]


def signal_margin_s(step_s: Optional[float]) -> int:
    """Seconds before the time limit at which Slurm's SIGUSR1 asks for a checkpoint: the step
    under way must end and a save must fit, so two predicted steps plus 5 minutes for the save,
    in whole minutes (at least 5). The trainer's own deadline (megatron_job_deadline) normally
    stops it earlier; the signal is the backstop."""
    extra = 2 * step_s if step_s else 0.0
    return int(60 * -(-(300 + extra) // 60))


def sbatch_script(spec: ClusterSpec, nodes: int, config_path: str, job_name: str = "megatron",
                  hours: int = 2, account: str = "<ACCOUNT>", run_dir: Optional[str] = None,
                  step_s: Optional[float] = None, schedule: Optional[str] = None) -> str:
    """On Frontier the run directory is `run_dir`, else <run root>/<config name> with the run
    root on Orion scratch (env.sh's megatron_run_root); RUN_DIR at submission overrides both.
    step_s: the predicted step time, which sizes the SIGUSR1 margin (signal_margin_s).
    schedule: the pipeline schedule the config sets and the plan priced, named in a comment."""
    g = spec.gpus_per_node
    frontier = spec.name == "frontier"
    # --kill-on-bad-exit: a rank that fails (a collective timed out on a hung peer) ends the
    # whole step at once instead of leaving srun waiting for the hung rank until the time limit.
    srun = [f"--ntasks-per-node={g}", f"--gpus-per-node={g}", "--gpu-bind=closest"]
    if spec.cpus_per_task:
        srun.append(f"-c {spec.cpus_per_task}")
    srun.append("--kill-on-bad-exit=1")
    lines = ["#!/bin/bash", f"#SBATCH -J {job_name}", f"#SBATCH -A {account}",
             f"#SBATCH -N {nodes}", f"#SBATCH -t {hours:02d}:00:00", "#SBATCH -o %x-%j.out",
             f"#SBATCH --signal=USR1@{signal_margin_s(step_s)}"]
    if frontier:
        lines += [f"#SBATCH {option}" for option in frontier_env.SBATCH_OPTIONS]
    lines.append(f"# Generated by megatron-plan for {spec.name}: {nodes} node(s) x {g} devices.")
    if schedule:
        lines.append(f"# Pipeline schedule {_schedule_note(schedule)}: "
                     f"parallel.pipeline_schedule in {config_path}, as the plan priced it.")
    lines += ["set -euo pipefail", ""]
    train = (f"srun {' '.join(srun)} python -m megatron.cli.train "
             f"--config {shlex.quote(config_path)}")
    if frontier:
        # Its settings replace the preset's launcher_env: one source for env.sh and this script.
        lines += _frontier_env_lines()
        name = os.path.splitext(os.path.basename(config_path))[0] or job_name
        default = shlex.quote(run_dir) if run_dir else f"$(megatron_run_root)/{shlex.quote(name)}"
        lines += ["# Run directory on Orion scratch when $MEMBERWORK/$PROJWORK are set (env.sh).",
                  f"RUN_DIR=${{RUN_DIR:-{default}}}",
                  'megatron_prepare_run_dir "$RUN_DIR"', "megatron_prepare_nodes",
                  "# The job's end time: training saves and exits 0 before it (env.sh).",
                  "megatron_job_deadline",
                  MASTER_NOTE, train + ' --set run.dir="$RUN_DIR" --set checkpoint.load=auto', ""]
        return "\n".join(lines)
    for key, value in spec.launcher_env.items():
        lines.append(f'export {key}="{value}"')
    if "MIOPEN_USER_DB_PATH" in spec.launcher_env:
        lines += ["# The MIOpen database must exist on every node before the ranks start.",
                  'srun --ntasks-per-node=1 mkdir -p "$MIOPEN_USER_DB_PATH"']
    lines += [MASTER_NOTE, train, ""]
    return "\n".join(lines)
