"""The GPT decoder: embedding -> L pre-norm layers -> final norm -> vocab-parallel head -> loss.

Two forms of the same modules: GPTModel for PP=1, and `pipeline_layers` (a DeepSpeed-free list of
layer descriptions) that engine/model.py turns into DeepSpeed pipeline layer specs, with the
token embedding tied between the first and the last stage. Every module takes the model section
and a ModelContext (context.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

import torch
from torch import nn

from megatron.config import ModelConfig
from megatron.model.context import ModelContext
from megatron.model.embedding import Embedding, OutputLayer
from megatron.model.loss import HeadWorkspace, fused_head_applies, head_loss, token_losses
from megatron.model.moe import MoELayer
from megatron.model.moe.router import update_bias
from megatron.model.norm import build_norm, norm_class
from megatron.model.transformer import TransformerLayer
from megatron.parallel.state import ParallelState
from megatron.parallel.cp_layout import local_tokens


def local_labels(labels: torch.Tensor, state: ParallelState) -> torch.Tensor:
    """labels [b, s] -> this context-parallel rank's [s/C, b] (the whole [s, b] without CP):
    the same tokens as the embedding's (parallel/cp_layout.py)."""
    return local_tokens(labels, state, dim=1).transpose(0, 1)


def counted_mean(losses: torch.Tensor, local: torch.Tensor, labels: torch.Tensor,
                 state: ParallelState) -> torch.Tensor:
    """losses [s(/C), b] of this rank's tokens, whose labels are `local` (local_labels);
    labels [b, s], the whole micro-batch's -> the
    micro-batch's mean loss over its counted labels (non-negative: a negative label, such as
    data.eod_mask_loss's, takes no part), as this rank's share. Each rank of a context-parallel
    group divides its sum by the micro-batch's count over C (read off the whole labels every
    rank holds, no collective), so the group's mean (the engine's, over data x context
    parallel) is the micro-batch's mean however its counted labels fall over the ranks; with
    none ignored this is the plain mean. A micro-batch with none counted gives 0."""
    keep = local >= 0
    whole = keep if state.cp == 1 else labels >= 0
    counted = whole.sum().clamp_(min=1).to(losses.dtype) / state.cp
    return losses.masked_fill(keep.logical_not(), 0.0).sum() / counted


def lm_loss(logits: torch.Tensor, labels: torch.Tensor, state: ParallelState) -> torch.Tensor:
    """logits [s(/C), b, V/t]; labels [b, s] -> the micro-batch's mean token loss (fp32) over
    its counted labels, as this rank's share (counted_mean)."""
    local = local_labels(labels, state)
    return counted_mean(token_losses(logits, local.clamp(min=0), state), local, labels, state)


class GPTModel(nn.Module):
    """Parameter names (embedding., layers.<i>., final_norm., output.) are the checkpoint's."""

    def __init__(self, m: ModelConfig, ctx: ModelContext):
        super().__init__()
        self.state, self.documents = ctx.state, ctx.documents
        self.embedding = Embedding(m, ctx)
        self.layers = nn.ModuleList(TransformerLayer(m, ctx, i) for i in range(m.num_layers))
        self.final_norm = build_norm(m, ctx)
        self.output = None if m.tie_embeddings else OutputLayer(m, ctx)
        self.head_workspace = HeadWorkspace()
        self.softcap = m.output.logit_softcapping
        # A plain list, not submodules: the MoE layers are registered under layers.<i>.mlp.
        self.moe_layers = [layer.mlp for layer in self.layers if isinstance(layer.mlp, MoELayer)]

    def forward(self, tokens: torch.Tensor, labels: Optional[torch.Tensor] = None):
        # the whole samples' documents, which every layer is given (model/context.Documents)
        docs = self.documents.read(tokens) if self.documents is not None else None
        x = self.embedding(tokens, docs)  # [s, b, h]
        for layer in self.layers:
            x = layer(x, docs)
        x = self.final_norm(x)
        head = self.embedding.word_embeddings if self.output is None else self.output.head
        # the fused head computes the loss from unmaterialised logits: none to cap
        if labels is not None and not self.softcap and fused_head_applies(x, head.weight,
                                                                          self.state):
            local = local_labels(labels, self.state)
            losses = head_loss(x, head.weight, local.clamp(min=0), self.head_workspace)
            return counted_mean(losses, local, labels, self.state)
        logits = self.embedding.logits(x) if self.output is None else self.output(x)
        return logits if labels is None else lm_loss(logits, labels, self.state)

    def moe_stats(self) -> List[dict]:
        """Each MoE layer's numbers of the last forward (aux and z loss, tokens per expert max
        and mean, dropped fraction), for a loop to log; [] for a dense model."""
        return [layer.stats.as_dict() for layer in self.moe_layers if layer.stats is not None]


@dataclass
class PipeLayer:
    """A DeepSpeed-free description of one pipeline layer: `cls(*args)` builds it; `tie_key`
    ties its `tied_attr` across stages; `forward_fn(module, x)` replaces module.forward; `name`
    is the GPTModel name prefix of its parameters (checkpoints name them as GPTModel does)."""
    cls: type
    args: Tuple[Any, ...]
    name: str
    tie_key: Optional[str] = None
    tied_attr: str = "word_embeddings.weight"
    forward_fn: Optional[Callable] = None


def _tied_logits(module: Embedding, x: torch.Tensor) -> torch.Tensor:
    return module.logits(x)


class EmbeddingReadingDocuments(Embedding):
    """The first stage's embedding under data.reset_attention_mask / reset_position_ids:
    tokens -> (hidden, the micro-batch's documents), the documents read off the tokens
    (model/context.Documents) for the layers after it, on this stage and the next ones."""

    def __init__(self, m: ModelConfig, ctx: ModelContext):
        super().__init__(m, ctx)
        self.reader = ctx.documents

    def forward(self, tokens: torch.Tensor):
        docs = self.reader.read(tokens)
        return super().forward(tokens, docs), docs


class TransformerLayerWithDocuments(TransformerLayer):
    """(hidden, documents) -> (hidden, documents): a decoder layer between pipeline layers that
    carry the documents. DeepSpeed's pipeline engine sends the documents (int64) with the
    activation and keeps only the floating-point tensors for the backward."""

    def forward(self, inputs):
        x, docs = inputs
        return super().forward(x, docs), docs


def _drops_documents(cls: type) -> type:
    """cls (the final norm) taking (hidden, documents) and returning its own output."""
    def forward(self, inputs):
        return cls.forward(self, inputs[0])
    return type(f"{cls.__name__}AfterDocuments", (cls,), {"forward": forward})


def pipeline_layers(m: ModelConfig, ctx: ModelContext) -> List[PipeLayer]:
    """GPTModel's modules in order, one pipeline layer each: the embedding, the L decoder
    layers, the final norm, and the output head (the embedding again when tied). Under
    data.reset_attention_mask / reset_position_ids the activation between the embedding and
    the final norm is (hidden, documents): the embedding reads them, each layer passes them on
    (parameter names as GPTModel's)."""
    tie = "embed" if m.tie_embeddings else None
    documents = ctx.documents is not None
    embedding = EmbeddingReadingDocuments if documents else Embedding
    layer = TransformerLayerWithDocuments if documents else TransformerLayer
    final_norm = _drops_documents(norm_class(m)) if documents else norm_class(m)
    layers = [PipeLayer(embedding, (m, ctx), "embedding.", tie_key=tie)]
    layers += [PipeLayer(layer, (m, ctx, i), f"layers.{i}.") for i in range(m.num_layers)]
    layers.append(PipeLayer(final_norm, (m, ctx), "final_norm."))
    if tie:
        # The last stage's copy only serves the tied output head: no position table there.
        layers.append(PipeLayer(Embedding, (m, ctx, False), "embedding.", tie_key=tie,
                                forward_fn=_tied_logits))
    else:
        layers.append(PipeLayer(OutputLayer, (m, ctx), "output."))
    return layers
