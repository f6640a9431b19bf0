"""Token (vocab-parallel) and learned position embeddings, and the output head that reuses the
token embedding when tied."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from megatron.config import ModelConfig, variants
from megatron.model.context import ModelContext, documents_of
from megatron.model.softcap import softcapped
from megatron.parallel.layers import (VocabParallelEmbedding, full_normal, parallel_lm_logits,
                                      replicated_param)
from megatron.parallel.mappings import (reduce_from_tp_region,
                                        reduce_scatter_to_sequence_parallel_region)
from megatron.parallel.random import dropout, seed_for
from megatron.parallel.cp_layout import local_tokens, token_index


class Embedding(nn.Module):
    """tokens [b, s] -> hidden [s, b, h] (or [s/t, b, h] under sequence parallelism). Under
    context parallelism every rank of the group gets the whole samples and keeps its slice of
    the sequence here ([s/C, b, h]; parallel/cp_layout.py says which tokens); learned positions
    are those tokens' global ones."""

    def __init__(self, m: ModelConfig, ctx: ModelContext, with_positions: bool = True):
        super().__init__()
        state, seed = ctx.state, ctx.seed
        self.state, self.tracker, self.p = state, ctx.tracker, m.hidden_dropout
        self.seq_par, self.overlap = ctx.sequence_parallel, ctx.tp_backward_overlap
        # data.reset_position_ids: positions from each document's start (model/context.py)
        self.reset_positions = ctx.documents is not None and ctx.documents.reset_positions
        self.multiplier = m.residual.embedding_multiplier
        self.softcap = m.output.logit_softcapping  # the tied head's logits' cap (0: none)
        self.word_embeddings = VocabParallelEmbedding(ctx.vocab_size, m.hidden_size, state,
                                                      init_std=m.init_method_std,
                                                      init_seed=seed_for(seed, "embedding"))
        # A position variant with a table (learned) declares it; its rows are added here.
        table = next(iter(variants.of(m, "position").weights), None)
        self.position_embeddings = None
        if table is not None and with_positions:
            self.position_embeddings = nn.Parameter(full_normal(
                table.full(m), m.init_method_std, seed_for(seed, "position_embedding")))

    def forward(self, tokens: torch.Tensor, docs: Optional[torch.Tensor] = None) -> torch.Tensor:
        """docs: the micro-batch's documents (model/context.Documents.read), under
        data.reset_position_ids."""
        state, seq = self.state, tokens.shape[1]
        tokens = local_tokens(tokens, state, dim=1)  # [b, s/C]
        # [b, s, h] -> [s, b, h], partial over TP; contiguous for the collectives and pipeline sends.
        x = self.word_embeddings.partial(tokens).transpose(0, 1).contiguous()
        if self.seq_par:
            x = reduce_scatter_to_sequence_parallel_region(x, state.tp_group)
            within = state.tp_rank * x.shape[0]  # this TP rank's share of the CP rank's tokens
        else:
            x = reduce_from_tp_region(x, state.tp_group)
            within = 0
        if self.multiplier != 1.0:  # model.residual.embedding_multiplier, in x's dtype
            x = x * torch.tensor(self.multiplier, dtype=x.dtype, device=x.device)
        if self.position_embeddings is not None:
            pos = replicated_param(self.position_embeddings, self.state, self.seq_par)
            at = self._positions(seq, within, x.shape[0], x.device)
            if not self.reset_positions:
                rows = pos[at].unsqueeze(1)  # [n, 1, h], the same for every sample
            else:  # [b, n] places in their documents -> [n, b, h]
                places = documents_of(docs, "reset_position_ids")[1]
                rows = pos[places[:, at]].transpose(0, 1)
            x = x + rows.to(x.dtype)
        return dropout(x, self.p, self.training, self.seq_par, self.tracker)

    def _positions(self, seq: int, within: int, n: int, device):
        """Global positions of this rank's n tokens, from the `within`-th of its CP share: a
        slice of the contiguous (Ulysses) share, or an index into the load-balanced one."""
        state = self.state
        if not state.cp_layout.balanced:
            first = state.cp_rank * (seq // state.cp) + within
            return slice(first, first + n)
        return token_index(seq, state.cp_rank, state.cp_layout, device)[within:within + n]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Tied output head: hidden [s(/t), b, h] -> logits [s, b, V/t]."""
        return softcapped(parallel_lm_logits(hidden, self.word_embeddings.weight, self.state,
                                             self.seq_par, overlap_backward=self.overlap),
                          self.softcap)


class OutputLayer(nn.Module):
    """Untied output head with its own vocab-parallel weight."""

    def __init__(self, m: ModelConfig, ctx: ModelContext):
        super().__init__()
        self.state = ctx.state
        self.seq_par, self.overlap = ctx.sequence_parallel, ctx.tp_backward_overlap
        self.softcap = m.output.logit_softcapping
        self.head = VocabParallelEmbedding(ctx.vocab_size, m.hidden_size, ctx.state,
                                           init_std=m.init_method_std,
                                           init_seed=seed_for(ctx.seed, "output_layer"))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return softcapped(parallel_lm_logits(hidden, self.head.weight, self.state, self.seq_par,
                                             overlap_backward=self.overlap), self.softcap)
