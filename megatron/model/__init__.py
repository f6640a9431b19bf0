"""The GPT model built from tensor-parallel layers."""
from __future__ import annotations

from datetime import timedelta
from typing import Optional

import torch

from megatron.base.deepspeed_json import sequence_parallel_on
from megatron.kernels import KernelSelection
from megatron.model.attention import resolve_attention_backend, window_error
from megatron.model.context import Documents, ModelContext
from megatron.model.gpt import GPTModel, PipeLayer, lm_loss, pipeline_layers
from megatron.parallel.experts import build_expert_parallel
from megatron.parallel.random import build_tracker
from megatron.parallel.state import ParallelState


def build_context(cfg, state: ParallelState, vocab_size: int,
                  device: torch.device = torch.device("cpu"),
                  eod: Optional[int] = None) -> ModelContext:
    """The one place the model reads the job config beyond its own section: resolves the
    attention backend, kernels and sequence parallelism once and seeds the dropout streams.
    eod: the end-of-document id, given by a trainer under data.reset_attention_mask (attention
    within documents) or data.reset_position_ids (positions from each document's start);
    without it the model attends causally over the sequence's positions (a conversion,
    generation)."""
    t, d = cfg.training, cfg.data
    documents = None
    if eod is not None and d.document_setting is not None:
        documents = Documents(eod, d.reset_attention_mask, d.reset_position_ids)
    backend = resolve_attention_backend(cfg.model.attention_backend, device, t.precision,
                                        documents=d.reset_attention_mask and eod is not None,
                                        softcap=bool(cfg.model.attention.logit_softcapping))
    window_error(cfg.model, backend)
    sel = KernelSelection(cfg.kernels.mode, device)
    tracker = build_tracker(t.seed, state.tp_rank, state.pp_rank, device)
    # The expert grid's groups (collective for EP > 1); a dense model builds none.
    expert = build_expert_parallel(state, cfg.parallel.expert_parallel_size, timedelta(
        minutes=cfg.parallel.timeout_minutes)) if cfg.model.moe.num_experts else None
    return ModelContext(state, vocab_size, backend, sel, tracker, seed=t.seed,
                        recompute=t.activation_checkpointing,
                        sequence_parallel=sequence_parallel_on(cfg),
                        expert=expert, tp_backward_overlap=cfg.parallel.tp_backward_overlap,
                        documents=documents)


def build_model(cfg, state: ParallelState, vocab_size: int,
                device: torch.device = torch.device("cpu")) -> GPTModel:
    """The whole model for PP=1 (all layers on this rank; TP slices per the state)."""
    return GPTModel(cfg.model, build_context(cfg, state, vocab_size, device))


__all__ = ["GPTModel", "ModelContext", "PipeLayer", "build_context", "build_model", "lm_loss",
           "pipeline_layers"]
