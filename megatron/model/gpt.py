"""The GPT decoder: embedding -> L pre-norm layers -> final norm -> vocab-parallel head -> loss.

Two forms of the same modules: GPTModel for PP=1, and `pipeline_layers` (a DeepSpeed-free list of
layer descriptions) that training/engine.py turns into DeepSpeed pipeline layer specs, with the
token embedding tied between the first and the last stage."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple

import torch
from torch import nn

from megatron.kernels import KernelSelection
from megatron.model.embedding import Embedding, OutputLayer
from megatron.model.loss import HeadWorkspace, fused_head_applies, head_loss, token_losses
from megatron.model.norm import Norm
from megatron.model.transformer import TransformerLayer
from megatron.parallel.random import RNGTracker
from megatron.parallel.state import ParallelState


@dataclass
class ModelContext:
    """What every module needs besides the config: the rank grid, the padded vocabulary, the
    resolved attention backend, the kernel choice and the dropout RNG tracker."""
    state: ParallelState
    vocab_size: int
    backend: str
    sel: KernelSelection
    tracker: RNGTracker


def lm_loss(logits: torch.Tensor, labels: torch.Tensor, state: ParallelState) -> torch.Tensor:
    """logits [s, b, V/t]; labels [b, s] -> mean token loss (fp32)."""
    return token_losses(logits, labels.transpose(0, 1), state).mean()


class FinalNorm(Norm):
    def __init__(self, cfg, ctx: ModelContext):
        seq_par = cfg.parallel.sequence_parallel and ctx.state.tp > 1
        super().__init__(cfg.model.normalization, cfg.model.hidden_size, cfg.model.norm_epsilon,
                         ctx.state, seq_par, ctx.sel)


class EmbeddingStage(Embedding):
    def __init__(self, cfg, ctx: ModelContext, with_positions: bool = True):
        super().__init__(cfg, ctx.state, ctx.vocab_size, ctx.tracker, with_positions)


class LayerStage(TransformerLayer):
    def __init__(self, cfg, ctx: ModelContext, layer_number: int):
        super().__init__(cfg, ctx.state, layer_number, ctx.backend, ctx.sel, ctx.tracker)


class OutputStage(OutputLayer):
    def __init__(self, cfg, ctx: ModelContext):
        super().__init__(cfg, ctx.state, ctx.vocab_size)


class GPTModel(nn.Module):
    def __init__(self, cfg, ctx: ModelContext):
        super().__init__()
        self.state = ctx.state
        self.embedding = EmbeddingStage(cfg, ctx)
        self.layers = nn.ModuleList(LayerStage(cfg, ctx, i) for i in range(cfg.model.num_layers))
        self.final_norm = FinalNorm(cfg, ctx)
        self.output = None if cfg.model.tie_embeddings else OutputStage(cfg, ctx)
        self.head_workspace = HeadWorkspace()

    def forward(self, tokens: torch.Tensor, labels: Optional[torch.Tensor] = None):
        x = self.embedding(tokens)  # [s, b, h]
        for layer in self.layers:
            x = layer(x)
        x = self.final_norm(x)
        head = self.embedding.word_embeddings if self.output is None else self.output.head
        if labels is not None and fused_head_applies(x, head.weight, self.state):
            target = labels.transpose(0, 1)
            return head_loss(x, head.weight, target, self.head_workspace).mean()
        logits = self.embedding.logits(x) if self.output is None else self.output(x)
        return logits if labels is None else lm_loss(logits, labels, self.state)


@dataclass
class PipeLayer:
    """A DeepSpeed-free description of one pipeline layer: `cls(*args)` builds it; `tie_key`
    ties its `tied_attr` across stages; `forward_fn(module, x)` replaces module.forward."""
    cls: type
    args: Tuple[Any, ...]
    tie_key: Optional[str] = None
    tied_attr: str = "word_embeddings.weight"
    forward_fn: Optional[Callable] = None
    name: str = field(default="")


def _tied_logits(module: EmbeddingStage, x: torch.Tensor) -> torch.Tensor:
    return module.logits(x)


def pipeline_layers(cfg, ctx: ModelContext) -> List[PipeLayer]:
    tied = cfg.model.tie_embeddings
    layers = [PipeLayer(EmbeddingStage, (cfg, ctx), tie_key="embed" if tied else None)]
    layers += [PipeLayer(LayerStage, (cfg, ctx, i)) for i in range(cfg.model.num_layers)]
    layers.append(PipeLayer(FinalNorm, (cfg, ctx)))
    if tied:
        # The last stage's copy only serves the tied output head: no position table there.
        layers.append(PipeLayer(EmbeddingStage, (cfg, ctx, False), tie_key="embed",
                                forward_fn=_tied_logits))
    else:
        layers.append(PipeLayer(OutputStage, (cfg, ctx)))
    return layers
