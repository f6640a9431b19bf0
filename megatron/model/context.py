"""What the model's modules need besides the model section, resolved once from the job config.

Every module takes (model_cfg, ctx): the model section (config.ModelConfig) says what the model
is; the context says how this rank runs it. model.build_context is the one place that reads the
rest of the job config for the model."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

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
