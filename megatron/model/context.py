"""What the model's modules need besides the model section, resolved once from the job config.

Every module takes (model_cfg, ctx): the model section (config.ModelConfig) says what the model
is; the context says how this rank runs it. model.build_context is the one place that reads the
rest of the job config for the model."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from megatron.kernels import KernelSelection
from megatron.parallel.experts import ExpertParallel
from megatron.parallel.random import RNGTracker
from megatron.parallel.state import ParallelState


@dataclass
class ModelContext:
    state: ParallelState  # the rank grid
    vocab_size: int  # padded vocabulary (rows of the word embedding and the output head)
    backend: str  # resolved attention backend: flash | sdpa | math
    sel: KernelSelection  # fused or reference kernels
    tracker: RNGTracker  # dropout streams
    seed: int  # training.seed: names every weight's initialisation stream
    recompute: str  # training.activation_checkpointing: none | selective | full
    # Activations sharded along the sequence inside the TP region: asked for and more than one
    # TP rank (with one rank there is nothing to shard).
    sequence_parallel: bool
    # Mixture of experts: this rank on the expert grid and its ep/edp groups (None: dense).
    expert: Optional[ExpertParallel] = None
    # parallel.tp_backward_overlap: column-parallel layers overlap their backward's TP collective
    # with their weight gradient (parallel/layers._ColumnLinear)
    tp_backward_overlap: bool = True
    # data.reset_attention_mask / reset_position_ids: the documents of the micro-batch in
    # flight, read off its tokens by GPTModel.forward and by every layer after it (None: causal
    # attention over the sequence's positions)
    documents: Optional["Documents"] = None


class Documents:
    """How a micro-batch's documents are read off its tokens: for attention within documents
    (attend_within) and for positions that restart at each document (reset_positions). read()
    returns them as one tensor that travels with the micro-batch's activations, argument by
    argument (GPTModel.forward) or in the tuple a pipeline stage sends the next
    (model/gpt.pipeline_layers), and that a recomputation holds as it held it: no layer reads
    another micro-batch's documents, however many are in flight."""

    def __init__(self, eod: int, attend_within: bool = True, reset_positions: bool = False):
        self.eod = eod
        self.attend_within, self.reset_positions = attend_within, reset_positions
        self.current = self.positions = None  # the last read's, for inspection

    def read(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [b, s], the whole sequence -> [2, b, s] int64: the number of end-of-documents
        before each token (an end-of-document is its document's last), and each token's place
        in its document, 0 at the token after an end-of-document (Megatron's
        --reset-position-ids; the sequence's positions when reset_positions is off)."""
        at_eod = tokens == self.eod
        self.current = at_eod.cumsum(dim=1) - at_eod.long()
        index = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        self.positions = index - document_starts(self.current) if self.reset_positions else index
        return torch.stack([self.current, self.positions])


def document_starts(documents: torch.Tensor) -> torch.Tensor:
    """documents [b, s], each token's document index (non-decreasing, Documents.read) -> [b, s],
    the place in the sequence where each token's document starts."""
    index = torch.arange(documents.shape[1], device=documents.device).expand_as(documents)
    change = torch.ones_like(documents, dtype=torch.bool)
    change[:, 1:] = documents[:, 1:] != documents[:, :-1]
    return torch.where(change, index, torch.zeros_like(index)).cummax(dim=1).values


_PARTS = [None, (None, None)]  # (the last documents tensor split, its two rows)


def documents_of(docs: Optional[torch.Tensor], what: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """(document index [b, s], positions [b, s]) of the documents a layer was given: the same
    two tensors for every layer given the same documents (so attention_cores.visible_keys
    makes one mask a micro-batch); a layer that runs without them (a caller that did not read
    them) stops here instead of crossing documents."""
    if docs is None:
        raise RuntimeError(f"data.{what}: a layer ran without the micro-batch's documents "
                           f"(GPTModel.forward and the pipeline's first stage read them)")
    if _PARTS[0] is not docs:
        _PARTS[:] = [docs, (docs[0], docs[1])]
    return _PARTS[1]
