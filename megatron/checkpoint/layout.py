"""The layout record of a checkpoint (what wrote it, and which model), the run's position it
carries (step, consumed samples, random streams), and which checkpoint a run continues from."""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from megatron.base import store
from megatron.base.records import CheckpointMeta, DataRecord, LayoutRecord, RollbackEvent
from megatron.base.rundir import RunDir, continuation
from megatron.config.errors import ConfigError, InputError
from megatron.config.sections import field_at
from megatron.data.blended_dataset import parse_paths
from megatron.data.fingerprint import fingerprint

log = logging.getLogger(__name__)

# Model fields that decide the shape of some weight: a checkpoint only fits a model equal in all.
SHAPE_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "kv_heads", "ffn_hidden_size",
                "max_position_embeddings", "position_embedding_type", "normalization",
                "activation", "add_bias_linear", "tie_embeddings", "num_experts",
                "moe_ffn_hidden_size", "moe_layer_freq", "moe_shared_expert_ffn_hidden_size")
# Fields recorded only where they differ from these (the dense model's values): records written
# before the field existed lack it and mean this value, and dense records stay as they were.
SHAPE_DEFAULTS = {"num_experts": 0, "moe_ffn_hidden_size": None, "moe_layer_freq": 1,
                  "moe_shared_expert_ffn_hidden_size": None}
# The record keys of the model.moe fields (the names they had before model.moe held them, which
# checkpoints written since keep): record key -> the dotted field
MOE_RECORD = {"num_experts": "moe.num_experts", "moe_ffn_hidden_size": "moe.ffn_hidden_size",
              "moe_layer_freq": "moe.layer_freq",
              "moe_shared_expert_ffn_hidden_size": "moe.shared_expert_ffn_hidden_size"}


def _shape_field(m, key: str):
    return field_at(m, MOE_RECORD.get(key, key))


def rng_state(tracker) -> Dict[str, Any]:
    default, streams = tracker.snapshot()
    return {"cpu": torch.get_rng_state(), "device": default, "streams": streams}


def set_rng_state(state: Optional[Dict[str, Any]], tracker) -> None:
    if not state:
        return
    torch.set_rng_state(state["cpu"])
    tracker.restore((state["device"], state["streams"]))


def model_shape(m) -> Dict[str, Any]:
    """The ModelConfig fields in SHAPE_FIELDS, by record key (those of SHAPE_DEFAULTS only when
    they differ from the default; model.moe's under MOE_RECORD's keys)."""
    return {name: _shape_field(m, name) for name in SHAPE_FIELDS
            if name not in SHAPE_DEFAULTS or _shape_field(m, name) != SHAPE_DEFAULTS[name]}


def shape_differences(theirs: Dict[str, Any], ours: Dict[str, Any], what: str) -> List[str]:
    """'model.X: <what> A, this run B' for each shape field where two model_shape()s differ; a
    field of SHAPE_DEFAULTS missing from either counts as its default."""
    out = []
    for k in list(ours) + [k for k in SHAPE_DEFAULTS if k not in ours]:
        a, b = (d.get(k, SHAPE_DEFAULTS.get(k)) for d in (theirs, ours))
        if a != b:
            out.append(f"model.{MOE_RECORD.get(k, k)}: {what} {a!r}, this run {b!r}")
    return out


def layout_record(cfg, dp: int, padded_vocab: int, text_vocab: int) -> LayoutRecord:
    """The layout that writes a checkpoint and the model it holds (which must match on resume;
    the layout may change)."""
    p = cfg.parallel
    return LayoutRecord(p.tensor_parallel_size, p.pipeline_parallel_size, dp, p.zero_stage,
                        padded_vocab, text_vocab, model_shape(cfg.model),
                        context_parallel_size=p.context_parallel_size,
                        expert_parallel_size=p.expert_parallel_size)


def data_record(cfg) -> DataRecord:
    """The settings that define the sample stream consumed_samples counts in, and the data
    files' fingerprints (their identity by content)."""
    d = cfg.data
    prints = None if d.synthetic else [fingerprint(p) for p in parse_paths(d.paths)[1]]
    return DataRecord(cfg.model.seq_length, d.synthetic, list(d.paths), d.split,
                      d.tokenizer_type, d.tokenizer_model, d.vocab_file, d.merges_file, d.seed,
                      prints, cfg.training.global_batch_size, cfg.training.rampup_batch_size)


def stream_changes(saved: DataRecord, current: DataRecord, folder: str = "") -> List[str]:
    """'field: checkpoint A, this run B' for each difference of the sample stream. The data
    files count by content where both records have fingerprints (files moved elsewhere are the
    same stream; a file rebuilt in place is not); a record without them compares paths."""
    names = {"seq_length": "model.seq_length"}
    changed = [f"{names.get(k, 'data.' + k)}: checkpoint {v!r}, this run {getattr(current, k)!r}"
               for k, v in dataclasses.asdict(saved).items()
               if k not in ("paths", "fingerprints", "global_batch_size", "rampup_batch_size")
               and getattr(current, k) != v]
    if saved.fingerprints is None or current.fingerprints is None:
        if saved.paths != current.paths:
            changed.append(f"data.paths: checkpoint {saved.paths!r}, this run {current.paths!r}")
    elif saved.fingerprints != current.fingerprints:
        changed.append(f"data.paths: the files' contents differ (checkpoint {saved.paths!r}: "
                       f"{saved.fingerprints}; this run {current.paths!r}: "
                       f"{current.fingerprints})")
    elif saved.paths != current.paths:
        log.info("checkpoint %s was trained on %s; the same files (by content) are now at %s: "
                 "continuing at its data position", folder, saved.paths, current.paths)
    return changed


def check_data(resume: "Resume", current: DataRecord, new_stream: bool,
               keep_position: bool = False) -> bool:
    """Refuses a checkpoint whose sample stream differs from this run's, field by field, unless
    checkpoint.new_data_stream (returns True: the stream starts afresh) or
    checkpoint.keep_data_position (the new stream continues at the checkpoint's position). A v1
    checkpoint did not record its stream: nothing to compare."""
    saved = resume.meta.data
    if saved is None:
        log.info("checkpoint %s does not record its data stream (written before format v2); "
                 "continuing at its data position as is", resume.folder)
        return False
    changed = stream_changes(saved, current, resume.folder)
    if not changed:
        return False
    if new_stream:
        log.warning("checkpoint.new_data_stream=true: resuming %s with another sample stream (%s); "
                    "the new stream starts at its first sample", resume.folder, "; ".join(changed))
        return True
    if keep_position:
        log.warning("checkpoint.keep_data_position=true: resuming %s with another sample stream "
                    "(%s) at its position, consumed_samples=%d", resume.folder,
                    "; ".join(changed), resume.meta.consumed_samples)
        return False
    raise InputError(f"checkpoint {resume.folder} was trained on another sample stream than "
                     f"this run's config ({'; '.join(changed)}): its data position "
                     f"(consumed_samples={resume.meta.consumed_samples}) means nothing in this "
                     "one. Resume with the settings and files it was trained with (its run "
                     "directory keeps config.yaml); or keep its weights, optimizer and step and "
                     "either set checkpoint.new_data_stream=true to start the new stream from its "
                     "first sample, or checkpoint.keep_data_position=true to continue the new "
                     "stream at the checkpoint's position (samples before it are skipped)")


@dataclass
class Resume:
    """The checkpoint a run continues from, and the newest complete one before it (named when
    a file of the chosen one turns out damaged)."""
    folder: str
    step: int
    meta: CheckpointMeta
    last_good: Optional[str] = None
    new_stream: bool = False  # checkpoint.new_data_stream let another sample stream resume it


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
    """The checkpoint checkpoint.load names: with 'auto', the newest complete checkpoint under
    <run.dir>/checkpoints (None for a fresh start); otherwise a checkpoints folder or one
    checkpoint folder. Newer incomplete ones are named in a warning and skipped, never deleted."""
    load = cfg.checkpoint.load
    if load is None:
        return None
    if load == "auto":
        return _complete(RunDir(cfg.run.dir).checkpoints, "checkpoint.load=auto")
    if os.path.isfile(os.path.join(load, store.META)):
        try:
            meta = store.validate(load)
        except (store.Incomplete, OSError) as e:
            raise InputError(f"checkpoint.load={load!r} cannot be resumed: {e}") from None
        return Resume(load, meta.step, meta)
    resume = _complete(load, f"checkpoint.load={load!r}") if os.path.isdir(load) else None
    if resume is None:
        raise ConfigError("checkpoint.load", load,
                          "a checkpoints folder holding a complete checkpoint (step_N/meta.json) "
                          "or one checkpoint folder",
                          "point it at <run.dir>/checkpoints, or use checkpoint.load=auto")
    return resume


def check_continues_newest(cfg, resume: Optional[Resume]) -> Optional[int]:
    """A run saves into <run.dir>/checkpoints, where checkpoint.load=auto (every chained job, a
    resumed run) takes the highest complete step. Starting below a complete checkpoint there (a
    fresh start, checkpoint.init_from, or checkpoint.load naming an older one) would leave that
    checkpoint of another history to be resumed before this run's own, or set it aside when this
    run reaches its step: refused, naming it and the ways out; with checkpoint.roll_back, the
    step of that newest checkpoint is returned instead (roll_back moves it and the rest above the
    start). None when the run starts at or above the newest. checkpoint.load=auto resumes that
    newest one by definition (find_resume validated it): nothing to check again."""
    if cfg.checkpoint.load == "auto":
        return None
    own = RunDir(cfg.run.dir).checkpoints
    newest, _ = store.newest_complete(own)
    start = resume.step if resume is not None else 0
    if newest is None or newest.step <= start:
        return None
    if cfg.checkpoint.roll_back:
        return newest.step
    here = f"run.dir {cfg.run.dir!r} holds a complete checkpoint at step {newest.step} " \
           f"({newest.folder})"
    if resume is None:
        raise InputError(
            f"{here}, and this run starts afresh (checkpoint.load is not set"
            f"{'; checkpoint.init_from only starts a run' if cfg.checkpoint.init_from else ''}):"
            f" its saves would mix with that run's, and checkpoint.load=auto would later resume "
            f"the older run's newest step. Continue it with --set checkpoint.load=auto; or train "
            f"into a new folder (--set run.dir=...); or set checkpoint.roll_back=true to move "
            f"its checkpoints out of {own} (into {RunDir(cfg.run.dir).rolled_back}) and start "
            f"afresh here")
    raise InputError(
        f"{here}, newer than the checkpoint this run continues from ({resume.folder}, step "
        f"{resume.step}): checkpoint.load=auto would later resume that newer step before this "
        f"run's own saves. Continue this run's newest with --set checkpoint.load=auto; to roll "
        f"back, --set checkpoint.roll_back=true moves the checkpoints above step {resume.step} "
        f"out of {own} (into {RunDir(cfg.run.dir).rolled_back}); or train into a new folder "
        f"(--set run.dir=...)")


def roll_back(cfg, start: int, newest: int) -> RollbackEvent:
    """checkpoint.roll_back: moves this run's checkpoints above `start` (up to `newest`) into a
    new folder of <run.dir>/rolled_back, and says so; returns the event for metrics.jsonl. Rank
    0, under the run's lock, before anything of this run is written."""
    run = RunDir(cfg.run.dir)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = os.path.join(run.rolled_back, f"{stamp}-above-{store.tag_for(start)}")
    n = 1
    while os.path.exists(dest):
        n += 1
        dest = os.path.join(run.rolled_back, f"{stamp}-above-{store.tag_for(start)}-{n}")
    moved = store.set_aside_above(run.checkpoints, start, dest)
    log.warning("checkpoint.roll_back: this run starts at step %d, below its run's newest "
                "checkpoint (step %d): moved %d checkpoint folder(s) above step %d (%s) into %s; "
                "nothing was deleted (remove them when sure)", start, newest, len(moved), start,
                ", ".join(os.path.basename(f) for f in moved), dest)
    return RollbackEvent(newest, start, f"checkpoint.roll_back: {len(moved)} checkpoint "
                                        f"folder(s) above step {start} moved into {dest}")


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
