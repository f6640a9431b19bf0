"""Checkpoint conversion: merge the tensor- and pipeline-parallel shards of a run's DeepSpeed
checkpoint into one unsharded GPTModel state dict (TP=1, PP=1), and split such a state dict again
for another tensor-parallel size.

What megatron-train writes under <run.dir>/checkpoints/<tag>/ (training/engine.py):
  PP=1  mp_rank_{t:02d}_model_states.pt: key 'module' = GPTModel.state_dict() of TP rank t
  PP>1  layer_{i:02d}-model_{t:02d}-model_states.pt: pipeline layer i of TP rank t, with
        i = 0 embedding, 1..L transformer layers, L+1 final norm, L+2 output head. A tied head
        is the layer-0 embedding (DeepSpeed keeps the tied weights equal), so its file, when a
        DeepSpeed version writes one, is not read.

The single-file format (save_single / load_single), one torch.save'd dict:
  format             SINGLE_FORMAT
  config             Config.to_dict() with tensor_parallel_size = pipeline_parallel_size = 1
  state_dict         GPTModel parameter name -> tensor at TP=1, in the dtype training saved
  vocab_size         the tokenizer's vocabulary; embedding rows from vocab_size on are padding
  padded_vocab_size  rows of the word embedding (and of the untied output head)
  source             run_dir, tag, tensor/pipeline_parallel_size and step of the checkpoint

Vocabulary padding depends on TP (data/vocab.py). The merge keeps the padding rows of the source
layout as trained: they take part in the softmax of the loss, so keeping them reproduces the run's
loss exactly, while the logits of real ids never depend on them. trim_vocab drops them."""
from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from megatron.config import Config, ConfigError, InputError, load_config
from megatron.config.sections import SECTIONS
from megatron.config.validate import check_tensor_parallel
from megatron.data import tokenizer_vocab_size
from megatron.data.vocab import padded_vocab_size
from megatron.parallel.layers import shard

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
    if not os.path.isdir(run_dir):
        raise InputError(f"run directory {run_dir!r} does not exist; pass a directory written by "
                         "megatron-train (it holds config.yaml and checkpoints/)")
    path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(path):
        raise InputError(f"{path!r} is missing: {run_dir!r} is not a run directory written by "
                         "megatron-train (it holds config.yaml and checkpoints/)")
    return load_config(path)


def latest_checkpoint(ckpt_dir: str) -> str:
    latest = os.path.join(ckpt_dir, "latest")
    if not os.path.isfile(latest):
        raise InputError(f"no checkpoint in {ckpt_dir!r} (no 'latest' file); train with "
                         "training.save=true or point --run-dir at a run that saved one")
    with open(latest) as f:
        return os.path.join(ckpt_dir, f.read().strip())


def checkpoint_folder(run_dir: str, tag: Optional[str] = None) -> str:
    """<run_dir>/checkpoints/<tag>, the latest one when tag is None."""
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    folder = latest_checkpoint(ckpt_dir) if tag is None else os.path.join(ckpt_dir, tag)
    if not os.path.isdir(folder):
        found = sorted(d for d in os.listdir(ckpt_dir)
                       if os.path.isdir(os.path.join(ckpt_dir, d))) if os.path.isdir(ckpt_dir) \
            else []
        raise InputError(f"checkpoint folder {folder!r} does not exist; tags found in "
                         f"{ckpt_dir!r}: {', '.join(found) or 'none'}")
    return folder


def _load(path: str) -> Any:
    if not os.path.isfile(path):
        raise InputError(f"checkpoint file {path!r} is missing; the folder is incomplete for the "
                         "layout in the run's config.yaml (copy every rank's files)")
    # Our own checkpoints: DeepSpeed pickles non-tensor state next to the weights.
    return torch.load(path, map_location="cpu", weights_only=False)


# --- tensor-parallel layout -------------------------------------------------------------------

def tp_partition(name: str, cfg: Config):
    """(dim, stride) of a GPTModel parameter sharded over TP, or None when replicated. Mirrors
    the layers in parallel/layers.py; tests check it against the live model's partition_dim."""
    if name.endswith(("word_embeddings.weight", "output.head.weight")):
        return 0, 1  # vocab-parallel rows
    if ".attention.qkv." in name:
        return 0, 1  # whole key/value groups per rank: [q heads of the group, k, v] each
    if ".mlp.fc1." in name:
        # SwiGLU fc1 is [gate; up]: each rank holds its slice of gate, then its slice of up.
        return 0, 2 if cfg.model.activation == "swiglu" else 1
    if name.endswith((".attention.dense.weight", ".mlp.fc2.weight")):
        return 1, 1  # row-parallel: input columns
    return None


def merge_tp(shards: List[StateDict], cfg: Config, where: str) -> StateDict:
    """One state dict per TP rank -> the unsharded one."""
    names = list(shards[0])
    for t, sd in enumerate(shards[1:], 1):
        if set(sd) != set(names):
            raise InputError(f"{where}: TP rank {t} holds parameters {sorted(sd)} but rank 0 "
                             f"holds {sorted(names)}; the checkpoint is not from one run")
    out = {}
    for name in names:
        parts = [sd[name] for sd in shards]
        rule = tp_partition(name, cfg)
        if rule is None or len(parts) == 1:
            out[name] = parts[0]  # replicated: every rank holds the same tensor
            continue
        dim, stride = rule
        blocks = [p.chunk(stride, dim=dim) for p in parts]
        out[name] = torch.cat([blocks[t][b] for b in range(stride) for t in range(len(parts))],
                              dim=dim).contiguous()
    return out


def split_tp(full: StateDict, cfg: Config, tp: int) -> List[StateDict]:
    """The unsharded state dict -> one per TP rank (the inverse of merge_tp)."""
    out: List[StateDict] = [{} for _ in range(tp)]
    for name, tensor in full.items():
        rule = tp_partition(name, cfg)
        for t in range(tp):
            out[t][name] = tensor.clone() if rule is None else shard(tensor, rule[0], t, tp,
                                                                     rule[1])
    return out


# --- reading the shards -----------------------------------------------------------------------

def pipeline_prefixes(cfg: Config) -> List[str]:
    """GPTModel name prefix of each saved pipeline layer (index = pipeline layer)."""
    n = cfg.model.num_layers
    prefixes = ["embedding."] + [f"layers.{i}." for i in range(n)] + ["final_norm."]
    if not cfg.model.tie_embeddings:
        prefixes.append("output.")
    return prefixes


def _read_tp_rank(folder: str, cfg: Config, t: int) -> StateDict:
    """Every parameter TP rank t holds, named as in GPTModel."""
    if cfg.parallel.pipeline_parallel_size == 1:
        module = _load(os.path.join(folder, f"mp_rank_{t:02d}_model_states.pt")).get("module")
        if not isinstance(module, dict):
            raise InputError(f"{folder}/mp_rank_{t:02d}_model_states.pt holds no 'module' state "
                             "dict; with pipeline parallelism the weights are in layer_*.pt files "
                             "(is pipeline_parallel_size in config.yaml right?)")
        return dict(module)
    sd: StateDict = {}
    for i, prefix in enumerate(pipeline_prefixes(cfg)):
        layer = _load(os.path.join(folder, f"layer_{i:02d}-model_{t:02d}-model_states.pt"))
        sd.update({prefix + name: tensor for name, tensor in layer.items()})
    return sd


def _step(folder: str) -> Optional[int]:
    path = os.path.join(folder, "mp_rank_00_model_states.pt")
    if not os.path.isfile(path):
        return None
    return _load(path).get("megatron", {}).get("step")


def single_config(cfg: Config, tp: int = 1) -> Config:
    """The same model with tensor_parallel_size=tp, pipeline_parallel_size=1."""
    par = dataclasses.replace(cfg.parallel, tensor_parallel_size=tp, pipeline_parallel_size=1,
                              sequence_parallel=cfg.parallel.sequence_parallel and tp > 1)
    return dataclasses.replace(cfg, parallel=par)


def merge_checkpoint(cfg: Config, folder: str, vocab_size: Optional[int] = None,
                     trim_vocab: bool = False) -> MergedCheckpoint:
    """The checkpoint in `folder`, written under the layout of `cfg`, as one unsharded model.
    vocab_size: the tokenizer's vocabulary (read from the run's tokenizer when None)."""
    tp, pp = cfg.parallel.tensor_parallel_size, cfg.parallel.pipeline_parallel_size
    vocab = tokenizer_vocab_size(cfg) if vocab_size is None else vocab_size
    log.info("merging %s (tp=%d pp=%d)", folder, tp, pp)
    full = merge_tp([_read_tp_rank(folder, cfg, t) for t in range(tp)], cfg, folder)
    rows = full["embedding.word_embeddings.weight"].shape[0]
    expected = padded_vocab_size(vocab, cfg.model.make_vocab_size_divisible_by, tp)
    if rows != expected:
        raise InputError(f"{folder}: the word embedding has {rows} rows, but a vocabulary of "
                         f"{vocab} padded for TP={tp} has {expected}; the tokenizer does not "
                         "match the one this run trained with")
    merged = MergedCheckpoint(single_config(cfg), full, vocab, rows, {
        "run_dir": cfg.run.dir, "tag": os.path.basename(os.path.normpath(folder)),
        "tensor_parallel_size": tp, "pipeline_parallel_size": pp, "step": _step(folder)})
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
            w = sd[name]
            sd[name] = w[:rows].clone() if rows <= w.shape[0] else torch.cat(
                [w, w.new_zeros(rows - w.shape[0], w.shape[1])])
    return dataclasses.replace(merged, state_dict=sd, padded_vocab_size=rows)


# --- the single file and the model ------------------------------------------------------------

def _check_output_folder(path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise InputError(f"output folder {parent!r} does not exist; create it or choose another "
                         "--output path")


def save_single(merged: MergedCheckpoint, path: str) -> None:
    _check_output_folder(path)
    torch.save({"format": SINGLE_FORMAT, "config": merged.config.to_dict(),
                "state_dict": merged.state_dict, "vocab_size": merged.vocab_size,
                "padded_vocab_size": merged.padded_vocab_size, "source": merged.source}, path)


def load_single(path: str, mmap: bool = False) -> MergedCheckpoint:
    """mmap: map the file instead of reading it, so a rank that keeps a slice of each tensor
    reads only those pages (every rank of a run loads the same file)."""
    if not os.path.isfile(path):
        raise InputError(f"{path!r} does not exist; write it with megatron-convert to-single")
    blob = torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
    if not isinstance(blob, dict) or blob.get("format") != SINGLE_FORMAT:
        raise InputError(f"{path!r} is not a {SINGLE_FORMAT} file written by megatron-convert "
                         "to-single")
    cfg = Config(**{name: cls(**blob["config"][name]) for name, cls in SECTIONS.items()})
    return MergedCheckpoint(cfg, blob["state_dict"], blob["vocab_size"],
                            blob["padded_vocab_size"], blob["source"])


def build_single_model(merged: MergedCheckpoint, device: torch.device = torch.device("cpu")):
    """An unsharded fp32 GPTModel holding the merged weights."""
    from megatron.model import build_model
    from megatron.parallel.state import ParallelState
    model = build_model(merged.config, ParallelState.single(), merged.padded_vocab_size, device)
    model.load_state_dict({k: v.float() for k, v in merged.state_dict.items()})
    return model


# --- resharding -------------------------------------------------------------------------------

def _reshard_target(cfg: Config, tp: int, output_dir: str) -> Config:
    """The config of the resharded run; raises InputError before any work when it cannot be."""
    if tp < 1:
        raise InputError(f"tensor-parallel size {tp} is invalid: expected a positive integer")
    target = single_config(cfg, tp)
    try:
        check_tensor_parallel(target)
    except ConfigError as e:
        raise InputError(f"cannot reshard to tensor-parallel size {tp}: {e.field}={e.value!r} "
                         f"must be {e.expected}") from None
    if os.path.exists(os.path.join(output_dir, "config.yaml")) or \
            os.path.exists(os.path.join(output_dir, "checkpoints")):
        raise InputError(f"output directory {output_dir!r} already holds a run; choose a new "
                         "--output-dir")
    return dataclasses.replace(target, run=dataclasses.replace(target.run, dir=output_dir))


def reshard(merged: MergedCheckpoint, tp: int, output_dir: str) -> str:
    """Writes `output_dir` as a model-only run of tensor_parallel_size=tp, PP=1: config.yaml and
    checkpoints/<tag>/mp_rank_XX_model_states.pt ({'module': state dict of TP rank XX}) with a
    'latest' file. It holds no optimizer state: read it with load_run / megatron-generate /
    megatron-convert to-single, not as a training resume point. The embedding is padded (zero
    rows) or trimmed to the padding of the new TP size. Returns the checkpoint folder."""
    cfg = _reshard_target(merged.config, tp, output_dir)
    rows = padded_vocab_size(merged.vocab_size, cfg.model.make_vocab_size_divisible_by, tp)
    shards = split_tp(resize_vocab(merged, rows).state_dict, cfg, tp)
    tag = merged.source.get("tag") or "converted"
    folder = os.path.join(output_dir, "checkpoints", tag)
    os.makedirs(folder)
    for t, sd in enumerate(shards):
        torch.save({"module": sd}, os.path.join(folder, f"mp_rank_{t:02d}_model_states.pt"))
    with open(os.path.join(output_dir, "checkpoints", "latest"), "w") as f:
        f.write(tag)
    with open(os.path.join(output_dir, "config.yaml"), "w") as f:
        f.write(cfg.to_yaml())
    log.info("wrote %d tensor-parallel shards to %s", tp, folder)
    return folder


def reshard_run(run_dir: str, tp: int, output_dir: str, tag: Optional[str] = None) -> str:
    """merge_run + reshard, with the target checked before anything is read."""
    _reshard_target(read_run_config(run_dir), tp, output_dir)
    return reshard(merge_run(run_dir, tag), tp, output_dir)


def convert_to_single(run_dir: str, output: str, tag: Optional[str] = None,
                      trim_vocab: bool = False) -> MergedCheckpoint:
    """merge_run + save_single, with the output folder checked before anything is read."""
    _check_output_folder(output)
    merged = merge_run(run_dir, tag, trim_vocab=trim_vocab)
    save_single(merged, output)
    return merged
