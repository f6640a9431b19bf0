"""What the model's modules need besides the model section, resolved once from the job config.

Every module takes (model_cfg, ctx): the model section (config.ModelConfig) says what the model
is; the context says how this rank runs it. model.build_context is the one place that reads the
rest of the job config for the model."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

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
    """Each micro-batch's documents: for attention within documents (attend_within) and for
    positions that restart at each document (reset_positions). A one-stage model holds every
    layer, so its forward reads them once and its layers (recomputed ones too: a micro-batch's
    backward runs before the next forward) read what it left."""

    def __init__(self, eod: int, attend_within: bool = True, reset_positions: bool = False):
        self.eod = eod
        self.attend_within, self.reset_positions = attend_within, reset_positions
        self.current = self.positions = None

    def read(self, tokens) -> None:
        """tokens [b, s], the whole sequence -> self.current [b, s]: the number of
        end-of-documents before each token, so an end-of-document is its document's last; and
        under reset_positions self.positions [b, s]: each token's place in its document, 0 at
        the token after an end-of-document (Megatron's --reset-position-ids)."""
        at_eod = tokens == self.eod
        self.current = at_eod.cumsum(dim=1) - at_eod.long()
        if self.reset_positions:
            index = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
            starts = torch.zeros_like(at_eod)
            starts[:, 1:] = at_eod[:, :-1]
            first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
            self.positions = index - first

    def of_micro_batch(self):
        """What read() left; a layer that runs before any read (a pipeline stage without the
        tokens, which the config refuses) stops here instead of crossing documents."""
        if self.current is None:
            raise RuntimeError("data.reset_attention_mask / reset_position_ids: a layer ran "
                               "before the model read the micro-batch's documents (one "
                               "pipeline stage only)")
        return self.current

    def positions_of_micro_batch(self):
        """Each token's position in its document [b, s] (reset_positions)."""
        self.of_micro_batch()
        return self.positions
