"""Checkpoint conversion: a run's checkpoint (any TP x PP x DP x ZeRO layout, sharded.py) as one
unsharded GPTModel state dict (TP=1, PP=1), and the single-file format built on it.

The single-file format (save_single / load_single), one torch.save'd dict:
  format             SINGLE_FORMAT
  config             Config.to_dict() with tensor_parallel_size = pipeline_parallel_size = 1
  state_dict         GPTModel parameter name -> tensor at TP=1: the fp32 master weights
  vocab_size         the tokenizer's vocabulary; embedding rows from vocab_size on are padding
  padded_vocab_size  rows of the word embedding (and of the untied output head)
  source             run_dir, tag, tensor/pipeline_parallel_size and step of the checkpoint

Vocabulary padding depends on TP (data/vocab.py). The merge keeps the padding rows of the source
layout as trained: they take part in the softmax of the loss, so keeping them reproduces the run's
loss exactly, while the logits of real ids never depend on them. trim_vocab drops them.

A merge reads one tensor at a time from memory-mapped shard files, but the merged model is held
whole: a tool for models that fit one host's memory (export, sampling). Training runs continue
in another layout without it: checkpoint.load reads any layout directly."""
from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, Optional

import torch

from megatron.config import Config, InputError, load_config
from megatron.config.errors import ConfigError, unexpanded
from megatron.data import tokenizer_vocab_size
from megatron.data.vocab import padded_vocab_size
from megatron.base import store
from megatron.base.outputs import check_output, write_whole
from megatron.base.rundir import RunDir, checkpoint_in
from megatron.checkpoint.sharded import Reader
from megatron.checkpoint.state import resize_rows

log = logging.getLogger(__name__)

SINGLE_FORMAT = "megatron-frontier/single-v1"
StateDict = Dict[str, torch.Tensor]


@dataclass
class MergedCheckpoint:
    config: Config  # the run's config with TP = PP = 1
    state_dict: StateDict
    vocab_size: int
    padded_vocab_size: int
    source: Dict[str, Any]


# --- where the checkpoint is ------------------------------------------------------------------

def read_run_config(run_dir: str) -> Config:
    run = RunDir(run_dir)
    run.require()
    return load_config(run.config)


def latest_checkpoint(ckpt_dir: str) -> str:
    """The newest complete checkpoint folder under a checkpoints folder (rundir.continuation)."""
    return checkpoint_in(ckpt_dir)


def checkpoint_folder(run_dir: str, tag: Optional[str] = None) -> str:
    """<run_dir>/checkpoints/<tag>, the newest complete one when tag is None."""
    return RunDir(run_dir).checkpoint(tag)


def read_checkpoint(folder: str):
    """(meta, index) of a committed checkpoint; InputError when it cannot be read."""
    try:
        return store.read(folder)
    except (store.Incomplete, OSError) as e:
        raise InputError(f"checkpoint {folder} cannot be read: {e}") from None


def single_config(cfg: Config, tp: int = 1) -> Config:
    """The same model with tensor_parallel_size=tp, pipeline_parallel_size=1. The run's
    sequence_parallel is kept: the model applies it only where TP > 1 (model.build_context)."""
    par = dataclasses.replace(cfg.parallel, tensor_parallel_size=tp, pipeline_parallel_size=1)
    return dataclasses.replace(cfg, parallel=par)


def merge_checkpoint(cfg: Config, folder: str, vocab_size: Optional[int] = None,
                     trim_vocab: bool = False) -> MergedCheckpoint:
    """The checkpoint in `folder` (any layout) as one unsharded model of the fp32 masters.
    vocab_size: the tokenizer's vocabulary (read from the run's tokenizer when None)."""
    meta, index = read_checkpoint(folder)
    tp, pp = meta.layout.tensor_parallel_size, meta.layout.pipeline_parallel_size
    vocab = tokenizer_vocab_size(cfg) if vocab_size is None else vocab_size
    log.info("merging %s (written by tp=%d pp=%d)", folder, tp, pp)
    reader = Reader(folder, index)
    full = {name: reader.merged(name, "master").contiguous() for name in sorted(index)}
    rows = full["embedding.word_embeddings.weight"].shape[0]
    expected = padded_vocab_size(vocab, cfg.model.make_vocab_size_divisible_by, tp)
    if rows != expected:
        raise InputError(f"{folder}: the word embedding has {rows} rows, but a vocabulary of "
                         f"{vocab} padded for TP={tp} has {expected}; the tokenizer does not "
                         "match the one this run trained with")
    merged = MergedCheckpoint(single_config(cfg), full, vocab, rows, {
        "run_dir": cfg.run.dir, "tag": os.path.basename(os.path.normpath(folder)),
        "tensor_parallel_size": tp, "pipeline_parallel_size": pp, "step": meta.step})
    return resize_vocab(merged, vocab) if trim_vocab else merged


def merge_run(run_dir: str, tag: Optional[str] = None, vocab_size: Optional[int] = None,
              trim_vocab: bool = False) -> MergedCheckpoint:
    """A run directory's checkpoint (the latest, or `tag`) of any TP/PP layout, merged."""
    cfg = read_run_config(run_dir)
    merged = merge_checkpoint(cfg, checkpoint_folder(run_dir, tag), vocab_size, trim_vocab)
    merged.source["run_dir"] = run_dir
    return merged


def resize_vocab(merged: MergedCheckpoint, rows: int) -> MergedCheckpoint:
    """Drops padding rows, or appends zero rows (logit 0 for dummy ids), to reach `rows`. The
    logits of real ids are unchanged; the loss moves slightly when the number of padding rows
    does, since those rows take part in the softmax."""
    if rows < merged.vocab_size:
        raise ValueError(f"cannot keep {rows} rows of a {merged.vocab_size}-token vocabulary")
    sd = dict(merged.state_dict)
    for name in ("embedding.word_embeddings.weight", "output.head.weight"):
        if name in sd:
            sd[name] = resize_rows(sd[name], rows).clone()
    return dataclasses.replace(merged, state_dict=sd, padded_vocab_size=rows)


# --- the single file and the model ------------------------------------------------------------

def check_output_file(path: str) -> None:
    """--output names a file to write (its folder created if missing), checked before any
    checkpoint is read (a merge or an import takes minutes on a large model)."""
    check_output("--output", path, "file", example="model.pt")


def save_single(merged: MergedCheckpoint, path: str) -> None:
    """Writes the file whole or not at all (`base.outputs.write_whole`), so an interrupted or
    failed write (a full disk) leaves no truncated file at `path`."""
    check_output_file(path)
    write_whole(path, "the merged checkpoint", lambda tmp: torch.save(
        {"format": SINGLE_FORMAT, "config": merged.config.to_dict(),
         "state_dict": merged.state_dict, "vocab_size": merged.vocab_size,
         "padded_vocab_size": merged.padded_vocab_size, "source": merged.source}, tmp))


def load_single(path: str, mmap: bool = False) -> MergedCheckpoint:
    """mmap: map the file instead of reading it, so a rank that keeps a slice of each tensor
    reads only those pages (every rank of a run loads the same file)."""
    if not os.path.isfile(path):
        raise InputError(f"{path!r} does not exist{unexpanded(path)}; write it with "
                         f"megatron-convert to-single")
    blob = torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
    if not isinstance(blob, dict) or blob.get("format") != SINGLE_FORMAT:
        raise InputError(f"{path!r} is not a {SINGLE_FORMAT} file written by megatron-convert "
                         "to-single")
    try:
        cfg = Config.from_dict(blob["config"])
    except ConfigError as e:
        raise InputError(f"{path!r}: its model's config cannot be read: {e}") from None
    return MergedCheckpoint(cfg, blob["state_dict"], blob["vocab_size"],
                            blob["padded_vocab_size"], blob["source"])


def build_single_model(merged: MergedCheckpoint, device: torch.device = torch.device("cpu")):
    """An unsharded fp32 GPTModel holding the merged weights."""
    from megatron.model import build_model
    from megatron.parallel.state import ParallelState
    model = build_model(merged.config, ParallelState.single(), merged.padded_vocab_size, device)
    model.load_state_dict({k: v.float() for k, v in merged.state_dict.items()})
    return model


def convert_to_single(run_dir: str, output: str, tag: Optional[str] = None,
                      trim_vocab: bool = False) -> MergedCheckpoint:
    """merge_run + save_single, with the output folder checked before anything is read."""
    check_output_file(output)
    merged = merge_run(run_dir, tag, trim_vocab=trim_vocab)
    save_single(merged, output)
    return merged
