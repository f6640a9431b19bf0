"""checkpoint.init_from: start a run from the weights of a single-file model (megatron-convert
to-single) in any layout. Each rank copies its tensor-parallel slice of its pipeline stage's
weights into the freshly built model before DeepSpeed wraps it, so the optimizer's fp32 master
copies start from them; the optimizer state, step and data position start fresh.

This is how a run moves to another layout (TP, PP, or the data-parallel size under ZeRO, whose
optimizer shards only fit the layout that wrote them), or continues from another run's weights."""
from __future__ import annotations

import logging
from typing import List, Tuple

import torch
from torch import nn

from megatron.config.errors import InputError
from megatron.parallel.layers import shard
from megatron.parallel.state import ParallelState
from megatron.checkpoint.convert import load_single
from megatron.checkpoint.layout import model_shape, shape_differences
from megatron.checkpoint.state import ExpertSplit, Partition, resize_rows

log = logging.getLogger(__name__)

@torch.no_grad()
def load_initial_weights(named: List[Tuple[str, nn.Parameter]], cfg, state: ParallelState,
                         padded_vocab: int, text_vocab: int) -> int:
    """Copies this rank's slices from cfg.checkpoint.init_from into its parameters (`named`: under
    their GPTModel names); returns the number of tensors copied. Raises InputError naming the
    file and the mismatch."""
    path = cfg.checkpoint.init_from
    merged = load_single(path, mmap=True)
    diff = shape_differences(model_shape(merged.config.model), model_shape(cfg.model), "file")
    if merged.vocab_size != text_vocab:
        diff.append(f"vocabulary: file {merged.vocab_size}, this run's tokenizer {text_vocab}")
    if diff:
        raise InputError(f"checkpoint.init_from={path!r} holds another model than this run's "
                         f"config ({'; '.join(diff)}); use the model config of the run it came "
                         f"from (the file keeps it: megatron.checkpoint.convert.load_single)")
    copied = 0
    for name, param in named:
        if name not in merged.state_dict:
            raise InputError(f"checkpoint.init_from={path!r} has no tensor {name!r} that this "
                             f"model needs; the file is not a complete megatron-convert "
                             f"to-single output")
        full = merged.state_dict[name]
        part = Partition.of(param)
        if part.vocab:
            full = resize_rows(full, padded_vocab)
        piece = full if part.dim is None else shard(full, part.dim, state.tp_rank, state.tp,
                                                    part.stride)
        split = ExpertSplit.of(param, tuple(param.shape))
        if split is not None:  # the file holds all experts [E, ...]: this rank's slice
            piece = piece[split.first:split.first + split.local]
        if piece.shape != param.shape:
            raise InputError(f"checkpoint.init_from={path!r}: {name} gives this rank a "
                             f"{tuple(piece.shape)} slice but the model holds "
                             f"{tuple(param.shape)}")
        param.copy_(piece.to(param.dtype))
        copied += 1
    log.info("initialised %d tensors from %s (step %s of %s, written at TP%s PP%s)", copied, path,
             merged.source.get("step"), merged.source.get("run_dir"),
             merged.source.get("tensor_parallel_size"), merged.source.get("pipeline_parallel_size"))
    return copied
