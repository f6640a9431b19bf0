"""What our checkpoints carry besides DeepSpeed's model and optimizer states: the step, the
consumed-sample count (so the data stream resumes exactly) and the random states."""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from megatron.config.errors import ConfigError, InputError

log = logging.getLogger(__name__)

LAYOUT_FILE = "layout.json"
# Model fields that decide the shape of some weight: a checkpoint only fits a model equal in all.
SHAPE_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "kv_heads", "ffn_hidden_size",
                "max_position_embeddings", "position_embedding_type", "normalization",
                "activation", "add_bias_linear", "tie_embeddings")


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


def model_shape(m) -> Dict[str, Any]:
    """The ModelConfig fields in SHAPE_FIELDS, by name."""
    return {name: getattr(m, name) for name in SHAPE_FIELDS}


def shape_differences(theirs: Dict[str, Any], ours: Dict[str, Any], what: str) -> List[str]:
    """'model.X: <what> A, this run B' for each shape field where two model_shape()s differ."""
    return [f"model.{k}: {what} {theirs.get(k)!r}, this run {v!r}"
            for k, v in ours.items() if theirs.get(k) != v]


def layout_record(cfg, dp: int, vocab_size: int) -> Dict[str, Any]:
    """What a checkpoint's shards depend on: the parallel layout and the weight shapes."""
    p = cfg.parallel
    return {"tensor_parallel_size": p.tensor_parallel_size,
            "pipeline_parallel_size": p.pipeline_parallel_size, "data_parallel_size": dp,
            "zero_stage": p.zero_stage, "padded_vocab_size": vocab_size,
            "model": model_shape(cfg.model)}


def write_layout(folder: str, record: Dict[str, Any]) -> None:
    with open(os.path.join(folder, LAYOUT_FILE), "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)


def _layout_text(r: Dict[str, Any]) -> str:
    return (f"TP{r['tensor_parallel_size']} PP{r['pipeline_parallel_size']} "
            f"DP{r['data_parallel_size']} ZeRO-{r['zero_stage']}")


def check_resume_layout(directory: str, tag: Optional[str], current: Dict[str, Any]) -> None:
    """Refuses, before anything is read, a checkpoint whose shards do not fit this run.

    DeepSpeed would otherwise fail deep inside its loader, or worse: with another data-parallel
    size its ZeRO-1/2 loader pads or truncates each rank's fp32 partition and trains on."""
    if tag is None:
        with open(os.path.join(directory, "latest")) as f:
            tag = f.read().strip()
    path = os.path.join(directory, tag, LAYOUT_FILE)
    if not os.path.isfile(path):
        log.warning("checkpoint %s has no %s (written by an older version): its layout is not "
                    "checked against this run", os.path.join(directory, tag), LAYOUT_FILE)
        return
    with open(path) as f:
        saved = json.load(f)
    shape = shape_differences(saved["model"], current["model"], "checkpoint")
    if shape:
        raise InputError(f"checkpoint {os.path.join(directory, tag)} holds another model than "
                         f"this run's config ({'; '.join(shape)}); resume with the config it "
                         f"was trained with (its run directory keeps config.yaml)")
    keys = ["tensor_parallel_size", "pipeline_parallel_size"]
    if saved["zero_stage"] > 0 or current["zero_stage"] > 0:
        keys += ["data_parallel_size", "zero_stage"]  # ZeRO partitions by data-parallel rank
    if any(saved[k] != current[k] for k in keys):
        raise InputError(
            f"checkpoint {os.path.join(directory, tag)} was written by a {_layout_text(saved)} "
            f"run and this run is {_layout_text(current)}: its model and optimizer shards only "
            f"fit the layout that wrote them{' (ZeRO partitions the optimizer state by data-parallel rank)' if 'zero_stage' in keys else ''}. "
            f"Resume with that layout (--set parallel.tensor_parallel_size="
            f"{saved['tensor_parallel_size']} --set parallel.pipeline_parallel_size="
            f"{saved['pipeline_parallel_size']} --set parallel.zero_stage={saved['zero_stage']} on "
            f"{saved['tensor_parallel_size'] * saved['pipeline_parallel_size'] * saved['data_parallel_size']}"
            f" ranks), or continue in the new layout from its weights with a fresh optimizer: "
            f"megatron-convert to-single --run-dir <run> --output model.pt, then "
            f"--set training.init_from=model.pt")
