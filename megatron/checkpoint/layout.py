"""The layout record of a checkpoint (what wrote it, and which model), the run's position it
carries (step, consumed samples, random streams), and which checkpoint a run continues from."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from megatron.checkpoint import store
from megatron.checkpoint.records import CheckpointMeta, LayoutRecord
from megatron.checkpoint.rundir import RunDir, continuation
from megatron.config.errors import ConfigError, InputError

log = logging.getLogger(__name__)

# Model fields that decide the shape of some weight: a checkpoint only fits a model equal in all.
SHAPE_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "kv_heads", "ffn_hidden_size",
                "max_position_embeddings", "position_embedding_type", "normalization",
                "activation", "add_bias_linear", "tie_embeddings")


def rng_state(tracker) -> Dict[str, Any]:
    default, streams = tracker.snapshot()
    return {"cpu": torch.get_rng_state(), "device": default, "streams": streams}


def set_rng_state(state: Optional[Dict[str, Any]], tracker) -> None:
    if not state:
        return
    torch.set_rng_state(state["cpu"])
    tracker.restore((state["device"], state["streams"]))


def model_shape(m) -> Dict[str, Any]:
    """The ModelConfig fields in SHAPE_FIELDS, by name."""
    return {name: getattr(m, name) for name in SHAPE_FIELDS}


def shape_differences(theirs: Dict[str, Any], ours: Dict[str, Any], what: str) -> List[str]:
    """'model.X: <what> A, this run B' for each shape field where two model_shape()s differ."""
    return [f"model.{k}: {what} {theirs.get(k)!r}, this run {v!r}"
            for k, v in ours.items() if theirs.get(k) != v]


def layout_record(cfg, dp: int, padded_vocab: int, text_vocab: int) -> LayoutRecord:
    """The layout that writes a checkpoint and the model it holds (which must match on resume;
    the layout may change)."""
    p = cfg.parallel
    return LayoutRecord(p.tensor_parallel_size, p.pipeline_parallel_size, dp, p.zero_stage,
                        padded_vocab, text_vocab, model_shape(cfg.model))


@dataclass
class Resume:
    """The checkpoint a run continues from, and the newest complete one before it (named when
    a file of the chosen one turns out damaged)."""
    folder: str
    step: int
    meta: CheckpointMeta
    last_good: Optional[str] = None


def _complete(ckpt_dir: str, where: str) -> Optional[Resume]:
    c = continuation(ckpt_dir)
    c.warn()
    if c.found is None:
        if c.skipped:
            raise InputError(f"{where}: no complete checkpoint in {ckpt_dir} ("
                             f"{c.only_broken()}); restore the missing files, or move the "
                             "folders away to start afresh")
        return None
    return Resume(c.found.folder, c.found.step, c.found.meta, c.last_good)


def find_resume(cfg) -> Optional[Resume]:
    """The checkpoint training.load names: with 'auto', the newest complete checkpoint under
    <run.dir>/checkpoints (None for a fresh start); otherwise a checkpoints folder or one
    checkpoint folder. Newer incomplete ones are named in a warning and skipped, never deleted."""
    load = cfg.training.load
    if load is None:
        return None
    if load == "auto":
        return _complete(RunDir(cfg.run.dir).checkpoints, "training.load=auto")
    if os.path.isfile(os.path.join(load, store.META)):
        try:
            meta = store.validate(load)
        except (store.Incomplete, OSError) as e:
            raise InputError(f"training.load={load!r} cannot be resumed: {e}") from None
        return Resume(load, meta.step, meta)
    resume = _complete(load, f"training.load={load!r}") if os.path.isdir(load) else None
    if resume is None:
        raise ConfigError("training.load", load,
                          "a checkpoints folder holding a complete checkpoint (step_N/meta.json) "
                          "or one checkpoint folder",
                          "point it at <run.dir>/checkpoints, or use training.load=auto")
    return resume


def check_model(resume: Resume, current: LayoutRecord) -> None:
    """Refuses a checkpoint of another model; any other parallel layout is fine."""
    saved = resume.meta.layout
    shape = shape_differences(saved.model, current.model, "checkpoint")
    if saved.vocab_size != current.vocab_size:
        shape.append(f"vocabulary: checkpoint {saved.vocab_size}, this run's tokenizer "
                     f"{current.vocab_size}")
    if shape:
        raise InputError(f"checkpoint {resume.folder} holds another model than this run's "
                         f"config ({'; '.join(shape)}); resume with the config it was trained "
                         f"with (its run directory keeps config.yaml)")
