"""training.init_from: start a run from the weights of a single-file model (megatron-convert
to-single) in any layout. Each rank copies its tensor-parallel slice of its pipeline stage's
weights into the freshly built model before DeepSpeed wraps it, so the optimizer's fp32 master
copies start from them; the optimizer state, step and data position start fresh.

This is how a run moves to another layout (TP, PP, or the data-parallel size under ZeRO, whose
optimizer shards only fit the layout that wrote them), or continues from another run's weights."""
from __future__ import annotations

import functools
import logging
from typing import Iterator, Tuple

import torch
from torch import nn

from megatron.config.errors import InputError
from megatron.parallel.layers import shard
from megatron.parallel.state import ParallelState
from megatron.training.checkpoint import model_shape, shape_differences
from megatron.training.convert import _pipeline_prefixes, load_single, tp_partition

log = logging.getLogger(__name__)

VOCAB_ROWS = ("embedding.word_embeddings.weight", "output.head.weight")


def _named_parameters(model: nn.Module, cfg) -> Iterator[Tuple[str, nn.Parameter]]:
    """This rank's parameters under their GPTModel (TP=1, PP=1) names."""
    if not hasattr(model, "forward_funcs"):  # PP=1: the GPTModel itself
        yield from model.named_parameters()
        return
    prefixes = _pipeline_prefixes(cfg)
    tied = {id(m) for m in model.tied_modules.values()}
    seen = set()
    for idx, func in enumerate(model.forward_funcs):
        module = func.args[0] if isinstance(func, functools.partial) else func
        if not isinstance(module, nn.Module):
            continue
        # A tied embedding is the same module on the first and the last stage.
        prefix = "embedding." if id(module) in tied else prefixes[idx + model._local_start]
        for name, param in module.named_parameters():
            if id(param) not in seen:
                seen.add(id(param))
                yield prefix + name, param


def _vocab_rows(full: torch.Tensor, rows: int) -> torch.Tensor:
    """The source's padded vocabulary rows cut or zero-padded to this run's padding (rows past
    the tokenizer's vocabulary are never a target; only real ids' rows carry learned values)."""
    if full.shape[0] >= rows:
        return full[:rows]
    return torch.cat([full, full.new_zeros(rows - full.shape[0], full.shape[1])])


@torch.no_grad()
def load_initial_weights(model: nn.Module, cfg, state: ParallelState, padded_vocab: int,
                         text_vocab: int) -> int:
    """Copies this rank's slices from cfg.training.init_from into `model`; returns the number
    of tensors copied. Raises InputError naming the file and the mismatch."""
    path = cfg.training.init_from
    merged = load_single(path, mmap=True)
    diff = shape_differences(model_shape(merged.config.model), model_shape(cfg.model), "file")
    if merged.vocab_size != text_vocab:
        diff.append(f"vocabulary: file {merged.vocab_size}, this run's tokenizer {text_vocab}")
    if diff:
        raise InputError(f"training.init_from={path!r} holds another model than this run's "
                         f"config ({'; '.join(diff)}); use the model config of the run it came "
                         f"from (the file keeps it: megatron.training.convert.load_single)")
    copied = 0
    for name, param in _named_parameters(model, cfg):
        if name not in merged.state_dict:
            raise InputError(f"training.init_from={path!r} has no tensor {name!r} that this "
                             f"model needs; the file is not a complete megatron-convert "
                             f"to-single output")
        full = merged.state_dict[name]
        if name in VOCAB_ROWS:
            full = _vocab_rows(full, padded_vocab)
        rule = tp_partition(name, cfg)
        piece = full if rule is None else shard(full, rule[0], state.tp_rank, state.tp, rule[1])
        if piece.shape != param.shape:
            raise InputError(f"training.init_from={path!r}: {name} gives this rank a "
                             f"{tuple(piece.shape)} slice but the model holds "
                             f"{tuple(param.shape)}")
        param.copy_(piece.to(param.dtype))
        copied += 1
    log.info("initialised %d tensors from %s (step %s of %s, written at TP%s PP%s)", copied, path,
             merged.source.get("step"), merged.source.get("run_dir"),
             merged.source.get("tensor_parallel_size"), merged.source.get("pipeline_parallel_size"))
    return copied
