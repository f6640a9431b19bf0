"""run.wandb: rank 0's metrics records, the same as metrics.jsonl's lines, mirrored to Weights &
Biases. "offline" writes under <run.dir>/wandb (a compute node of Frontier reaches no network;
`wandb sync <run.dir>/wandb/offline-run-*` from a login node uploads it later); "online" logs as
it goes. Without the wandb package the run goes on with metrics.jsonl and one warning says how to
install it.

Each record is one wandb.log call of its numbers and texts: a step as train/<key>, an evaluation
as <split>/loss (valid, test), an event as event/<kind>/<key> (event/save/gb_per_s, ...), with
"step" the x axis of every chart (define_metric), so a rollback's repeated steps are still
logged rather than dropped by W&B's own monotonic step counter. Each job of a chained run is a
W&B run of its own, grouped under the run's name (run.wandb_name or the run directory's)."""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Dict, Optional

from megatron.base.records import MetricsRecord, is_number
from megatron.base.rundir import RunDir

log = logging.getLogger(__name__)

INSTALL = ("run.wandb is set but the wandb package is not installed; metrics go to metrics.jsonl "
           "only: pip install wandb (or pip install 'megatron-frontier[wandb]')")


def flatten(record: MetricsRecord) -> Dict[str, Any]:
    """The record's values under their W&B names (strict-JSON cleaning is not needed: W&B keeps
    NaN and infinity). Read through the record's fields, as every reader of the records does."""
    kind = getattr(record, "event", None)
    split = getattr(record, "split", None)
    prefix = f"event/{kind}" if kind else (split or "train")
    out: Dict[str, Any] = {"step": record.step}
    for f in dataclasses.fields(record):
        if f.name in _NOT_LOGGED:
            continue
        value = getattr(record, f.name)
        if isinstance(value, bool):
            value = int(value)
        if is_number(value) or isinstance(value, str):
            out[f"{prefix}/{f.name}"] = value
    if kind:
        out[f"event/{kind}"] = 1
    return out


# The x axis, the prefix's parts, and what is no number (start-up phases, names of NaN keys).
_NOT_LOGGED = ("step", "event", "split", "startup", "nonfinite")


class WandbLogger:
    """One W&B run for a training run; None of it exists unless run.wandb is on."""

    def __init__(self, run: Any, wb: Any):
        self.run, self.wb = run, wb

    @classmethod
    def open(cls, run_dir: RunDir, run_cfg, config: Dict[str, Any]) -> Optional["WandbLogger"]:
        """run_cfg: the RunConfig; config: the whole resolved config (W&B's run config)."""
        if run_cfg.wandb == "off":
            return None
        try:
            import wandb
        except ImportError:
            log.warning("%s", INSTALL)
            return None
        os.makedirs(run_dir.path, exist_ok=True)
        name = run_cfg.wandb_name or os.path.basename(os.path.normpath(run_dir.path))
        try:
            run = wandb.init(mode=run_cfg.wandb, dir=run_dir.path, project=run_cfg.wandb_project,
                             name=name, group=name, entity=run_cfg.wandb_entity,
                             tags=list(run_cfg.wandb_tags), config=config,
                             settings=wandb.Settings(console="off", x_disable_stats=True))
        except Exception as e:  # noqa: BLE001 (monitoring must not end a run: wandb's errors vary)
            log.warning("run.wandb=%s: W&B did not start (%s: %s); metrics go to metrics.jsonl "
                        "only; for online, run `wandb login` first or use run.wandb=offline",
                        run_cfg.wandb, type(e).__name__, " ".join(str(e).split()))
            return None
        run.define_metric("step")
        run.define_metric("*", step_metric="step")
        log.info("W&B %s run %s in %s", run_cfg.wandb, name, run_dir.wandb)
        return cls(run, wandb)

    def write(self, record: MetricsRecord) -> None:
        self.run.log(flatten(record))

    def close(self) -> None:
        self.run.finish()
