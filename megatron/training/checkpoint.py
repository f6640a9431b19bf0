"""What our checkpoints carry besides DeepSpeed's model and optimizer states: the step, the
consumed-sample count (so the data stream resumes exactly) and the random states."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch

from megatron.config.errors import ConfigError


@dataclass
class CheckpointState:
    step: int
    consumed_samples: int
    rng: Any = None

    def to_dict(self) -> Dict[str, Any]:
        return {"megatron": {"step": self.step, "consumed_samples": self.consumed_samples,
                             "rng": self.rng}}

    @classmethod
    def from_dict(cls, client: Dict[str, Any]) -> "CheckpointState":
        ours = client.get("megatron", {})
        return cls(int(ours.get("step", 0)), int(ours.get("consumed_samples", 0)), ours.get("rng"))


def rng_state(tracker) -> Dict[str, Any]:
    default, streams = tracker.snapshot()
    return {"cpu": torch.get_rng_state(), "device": default, "streams": streams}


def set_rng_state(state: Optional[Dict[str, Any]], tracker) -> None:
    if not state:
        return
    torch.set_rng_state(state["cpu"])
    tracker.restore((state["device"], state["streams"]))


def find_resume(cfg) -> Optional[Tuple[str, Optional[str]]]:
    """(checkpoint directory, tag or None for DeepSpeed's 'latest'), or None for a fresh start."""
    load = cfg.training.load
    if load is None:
        return None
    directory = os.path.join(cfg.run.dir, "checkpoints") if load == "auto" else load
    has_latest = os.path.isfile(os.path.join(directory, "latest"))
    if load == "auto":
        return (directory, None) if has_latest else None
    if not os.path.isdir(directory) or not has_latest:
        raise ConfigError("training.load", load,
                          "a checkpoint directory holding a 'latest' file written by a previous run",
                          "point it at <run.dir>/checkpoints, or use training.load=auto")
    return directory, None
