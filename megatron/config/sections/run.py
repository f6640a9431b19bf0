"""The run section (the run directory and Weights & Biases) and the kernels section."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Literal, Optional

from megatron.config import plugins
from megatron.config.errors import ConfigError
from megatron.config.sections.checks import check_choices, written_out


@dataclass
class KernelsConfig:
    mode: Literal["auto", "fused", "torch"] = "auto"
    """auto: fused kernels where built and usable on this device, else the torch reference
    (logged once); fused: fail at start-up when a fused kernel cannot run; torch: never fused."""

    def __post_init__(self):
        check_choices("kernels", self)


@dataclass
class RunConfig:
    dir: str = "runs/default"
    """The run directory: config.yaml, deepspeed.json, metrics.jsonl, checkpoints/, TensorBoard
    events and the run's logs and events."""
    wandb: Literal["off", "offline", "online"] = "off"
    """Weights & Biases, from rank 0, the same records as metrics.jsonl: off; offline (files under
    <run.dir>/wandb, for a later `wandb sync` from a login node); or online."""
    wandb_project: str = "megatron-frontier"
    """The W&B project."""
    wandb_name: Optional[str] = None
    """The W&B run's name. null: the run directory's name."""
    wandb_entity: Optional[str] = None
    """The W&B entity (user or team). null: W&B's default for the logged-in user."""
    wandb_tags: List[str] = field(default_factory=list)
    """Tags of the W&B run, e.g. [frontier, 175b]."""
    plugins: List[str] = field(default_factory=list)
    """Modules of yours that register model variants, pipeline schedules or fused ops, e.g.
    [mypkg.variants] (mypkg/variants.py on PYTHONPATH or in the current directory): imported
    before the rest of the config is checked, so its fields may name what they register, and
    again by every command that reads the run's config.yaml (resuming, megatron-generate,
    megatron-convert, megatron-plan --config). megatron-train --plugin MODULE adds to it."""

    def __post_init__(self):
        if not self.dir:
            raise ConfigError("run.dir", self.dir, "a directory path")
        written_out("run", "dir", self.dir)
        plugins.check_names(self.plugins)
        check_choices("run", self)
        if not self.wandb_project:
            raise ConfigError("run.wandb_project", self.wandb_project, "a W&B project name")
        if not isinstance(self.wandb_tags, list) or not all(
                isinstance(t, str) and t for t in self.wandb_tags):
            raise ConfigError("run.wandb_tags", self.wandb_tags, "a list of non-empty strings",
                              "e.g. --set 'run.wandb_tags=[frontier, 175b]'")
