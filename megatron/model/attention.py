"""Causal self-attention with tensor parallelism over heads and grouped-query attention.

The projections are here; what runs between them is the attention core model.attention_backend
names (config/variants.py; the built-in flash, sdpa and math in attention_cores.py). The fused
QKV weight is laid out per key/value group as [q heads of the group, k, v], so a contiguous TP
slice holds whole groups.

Under context parallelism (parallel/ulysses.py) the layer sees its rank's slice of the sequence;
q, k and v are exchanged for whole-sequence heads before rotary positions and the core, so
positions are global and every core sees the causal mask of the whole sequence. Ring,
all-gather and hybrid context parallelism (parallel.context_parallel_algo) replace that by
model/context_attention.py, over the load-balanced tokens of parallel/cp_layout.py."""
from __future__ import annotations

import functools
import logging
import math
from typing import Optional

import torch
from torch import nn

from megatron.config import ModelConfig, variants
from megatron.config.errors import ConfigError
from megatron.model.context import ModelContext, documents_of
from megatron.model.context_attention import ContextAttention
from megatron.model import rotary
from megatron.model.norm import head_norm_class
from megatron.parallel.checkpointing import recompute
from megatron.parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.parallel.random import seed_for
from megatron.parallel import ulysses

log = logging.getLogger(__name__)


def resolve_attention_backend(requested: str, device: torch.device, precision: str,
                              documents: bool = False, softcap: bool = False) -> str:
    """The core to run: the one asked for (an error if it cannot run here), or for "auto" the
    first registered core that can. documents: data.reset_attention_mask, which only cores
    that take a document mask run (their record's `documents`). softcap:
    model.attention.logit_softcapping, which only cores that cap their scores run (their
    record's `softcapping`)."""
    needs = [need for asked, need in ((softcap, _CAPPING), (documents, _MASKING)) if asked]
    if needs:
        return _core_with(requested, device, precision, needs)
    if requested != variants.AUTO:
        core = variants.get("attention", requested)
        if not core.can_run(device.type, precision):
            runnable = [n for n in variants.names("attention")
                        if variants.get("attention", n).can_run(device.type, precision)]
            raise ConfigError("model.attention_backend", requested,
                              f"a core that can run on this {device.type} device in {precision}"
                              f"{': ' + core.needs if core.needs else ''}",
                              f"use model.attention_backend=auto or one of {', '.join(runnable)}")
        return requested
    skipped = []
    for name in variants.names("attention"):
        core = variants.get("attention", name)
        if core.can_run(device.type, precision):
            log.info("attention backend: auto chose %s%s", name,
                     f" ({'; '.join(skipped)})" if skipped else "")
            return name
        skipped.append(f"{name} unavailable" + (f": {core.needs}" if core.needs else ""))
    raise ConfigError("model.attention_backend", requested, "a registered core that can run here")


# What only some cores run: (the fact of their record, what a core with it does, the setting
# that asks for it, the setting that asks for none)
_CAPPING = ("softcapping", "caps its scores", "model.attention.logit_softcapping",
            "model.attention.logit_softcapping=0")
_MASKING = ("documents", "takes a document mask", "data.reset_attention_mask=true",
            "data.reset_attention_mask=false")


def _core_with(requested: str, device: torch.device, precision: str, needs) -> str:
    """The core for settings only cores with their records' facts run (_CAPPING, _MASKING):
    auto's first of them that can run here, or the one asked for if it has them."""
    having = [n for n in variants.names("attention")
              if all(getattr(variants.get("attention", n), fact) for fact, _, _, _ in needs)]
    runnable = [n for n in having if variants.get("attention", n).can_run(device.type, precision)]
    what, under = (" and ".join(need[i] for need in needs) for i in (1, 2))
    if requested == variants.AUTO and runnable:
        log.info("attention backend: auto chose %s (%s: a core that %s)", runnable[0], under, what)
        return runnable[0]
    if requested in having:
        return resolve_attention_backend(requested, device, precision)
    fix = (f"use model.attention_backend={(runnable or having)[0]}" if having else
           "register a core whose record has " + " and ".join(f"{need[0]}=True" for need in needs))
    off = " and ".join(need[3] for need in _lacking(requested, needs))
    raise ConfigError("model.attention_backend", requested,
                      f"a core that {what} under {under} "
                      f"({', '.join(having) or 'none registered'})", f"{fix}, or set {off}")


def _lacking(requested: str, needs):
    """The needs the requested core's record lacks (all of them for auto): the settings to turn
    off for it to run."""
    if requested not in variants.names("attention"):
        return needs
    core = variants.get("attention", requested)
    return [need for need in needs if not getattr(core, need[0])]


def window_error(m: ModelConfig, backend: str) -> None:
    """Refuses a core that does not attend within model.attention.sliding_window (a plugin
    core whose record lacks `sliding_window`), naming the cores that do."""
    if not m.attention.sliding_window or variants.get("attention", backend).sliding_window:
        return
    windowed = [n for n in variants.names("attention")
                if variants.get("attention", n).sliding_window]
    raise ConfigError("model.attention_backend", backend,
                      f"a core that attends within model.attention.sliding_window "
                      f"({', '.join(windowed)})", f"use model.attention_backend="
                      f"{windowed[0] if windowed else 'auto'}, register the core with "
                      "sliding_window=True, or set model.attention.sliding_window=0")


class SelfAttention(nn.Module):
    def __init__(self, m: ModelConfig, ctx: ModelContext, layer_number: int):
        super().__init__()
        state, seq_par = ctx.state, ctx.sequence_parallel
        self.state, self.sel, self.tracker = state, ctx.sel, ctx.tracker
        self.head_dim = m.head_dim
        self.groups_local = m.kv_heads // state.tp
        self.q_per_group = m.num_attention_heads // m.kv_heads
        self.selective = ctx.recompute == "selective"
        self.cp, self.cp_group = state.cp, state.cp_group
        self.kv_replicas = ulysses.kv_replicas(self.groups_local, self.q_per_group, state.cp)
        qkv_out = (m.num_attention_heads + 2 * m.kv_heads) * m.head_dim
        seed, std = ctx.seed, m.init_method_std
        self.qkv = ColumnParallelLinear(m.hidden_size, qkv_out, state, bias=m.qkv_bias,
                                        sequence_parallel=seq_par, init_std=std,
                                        init_seed=seed_for(seed, f"layer{layer_number}.qkv"),
                                        overlap_backward=ctx.tp_backward_overlap)
        # Output projection scaled by 1/sqrt(2L) (GPT-2 / Megatron) to keep the residual stable.
        self.dense = RowParallelLinear(m.num_attention_heads * m.head_dim, m.hidden_size, state,
                                       bias=m.add_bias_linear, sequence_parallel=seq_par,
                                       init_std=std / math.sqrt(2 * m.num_layers),
                                       init_seed=seed_for(seed, f"layer{layer_number}.proj"))
        # model.attention.softmax_scale: the queries times it x sqrt(d), so every core and
        # context-parallel algorithm, each scaling by 1/sqrt(d), scales the scores by it
        scale = m.attention.softmax_scale
        self.query_factor = None if scale is None else scale * math.sqrt(m.head_dim)
        self.q_norm = self.k_norm = None
        if m.attention.qk_norm:  # each head's q and k over their width, this rank's heads
            norm = head_norm_class(m)
            self.q_norm = norm(m, ctx, width=m.head_dim, per_rank=True)
            self.k_norm = norm(m, ctx, width=m.head_dim, per_rank=True)
        self.rotary = rotary.for_layer(m, layer_number)
        # Built under every layout, so the parameter names (a core may have weights) and the
        # checkpoint are the same whichever context-parallel algorithm runs.
        self.core = variants.attention_of(m, ctx.backend).build(m, ctx, layer_number)
        docs = ctx.documents  # how the micro-batch's documents are read (model/context.py)
        # data.reset_attention_mask: attend within them; data.reset_position_ids: rotary
        # positions from each one's start
        self.attend_within = docs is not None and docs.attend_within
        self.reset_positions = docs is not None and docs.reset_positions
        # Ring, all-gather and hybrid wrap the whole attention (model/context_attention.py).
        self.context = None
        if state.cp > 1 and state.cp_layout.balanced:
            self.context = ContextAttention(m, ctx, self.groups_local, self.q_per_group,
                                            layer_number)

    def _split(self, qkv: torch.Tensor):
        """[s, b, groups*(g+2)*d] -> q [s, b, groups*g, d], k and v [s, b, groups, d]. One split,
        whose backward writes qkv's gradient once (a cat of the three): indexing instead gives
        each of q, k and v a zero-filled gradient of qkv's whole size, and two more passes to
        add them (about 2% of a 1.3B model's step on an H200, benchmarks/e2e/op_traffic.py)."""
        s, b = qkv.shape[:2]
        g, d = self.q_per_group, self.head_dim
        q, k, v = qkv.view(s, b, self.groups_local, g + 2, d).split([g, 1, 1], dim=3)
        return q.reshape(s, b, self.groups_local * g, d), k.squeeze(3), v.squeeze(3)

    def _core(self, qkv: torch.Tensor, docs: Optional[torch.Tensor] = None) -> torch.Tensor:
        q, k, v = self._split(qkv)  # [s(/C), b, heads, d]
        if self.q_norm is not None:  # per head and token: before any exchange of heads
            q, k = self.q_norm(q), self.k_norm(k)
        if self.query_factor is not None:  # model.attention.softmax_scale, after the norm
            q = q * self.query_factor
        if self.context is not None:
            return self.context(q, k, v, docs)  # [s/C, b, heads*d]
        if self.cp > 1:  # [s/C, b, heads, d] -> [s, b, heads/C, d]
            q, k, v = ulysses.scatter_heads(q, k, v, self.cp_group, self.cp, self.kv_replicas)
        if self.rotary is not None and self.reset_positions:  # each sample's own
            at = documents_of(docs, "reset_position_ids")[1]
            q = self.rotary.apply_per_sample(q, at, self.sel)
            k = self.rotary.apply_per_sample(k, at, self.sel)
        elif self.rotary is not None:
            q, k = self.rotary.apply(q, self.sel), self.rotary.apply(k, self.sel)
        if not self.attend_within:
            out = self.core(q, k, v)  # [s, b, heads(/C)*d]
        else:  # the whole sequence's documents: Ulysses' ranks attend over all of it
            out = self.core(q, k, v, documents=documents_of(docs, "reset_attention_mask")[0])
        if self.cp > 1:
            out = ulysses.gather_heads(out, self.cp_group, self.cp)  # [s/C, b, heads*d]
        return out

    def forward(self, x: torch.Tensor, docs: Optional[torch.Tensor] = None) -> torch.Tensor:
        """docs: the micro-batch's documents (model/context.Documents), held by the
        recomputation as given."""
        qkv = self.qkv(x)  # [s, b, groups*(g+2)*d]
        if self.selective and self.training:
            core = self._core if docs is None else functools.partial(self._core, docs=docs)
            ctx = recompute(core, qkv, self.tracker)
        else:
            ctx = self._core(qkv, docs)
        return self.dense(ctx)
