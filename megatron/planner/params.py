"""Exact parameter counts per rank, following this project's GPT (megatron/model/gpt.py).

Pre-norm decoder. Per layer: norm1; fused QKV, column-parallel, [(heads + 2*kv) * head_dim, h],
with its bias under add_bias_linear or add_qkv_bias; under qk_norm two norms of head_dim
(replicated); the attention core's own weights, if its record declares any; attention output,
row-parallel, [h, heads * head_dim]; norm2; MLP fc1 column-parallel ([fc1_factor * ffn, h]: 1 for GeLU, 2 for SwiGLU) and
fc2 row-parallel [h, ffn]; under model.residual.post_norms a norm after the attention and one
after the MLP. Norms, cores and position tables count what their variant records
declare (config/variants.py). Column-parallel weights and biases and
the row-parallel weights are split over TP; norms and row-parallel biases are replicated. The
vocab-parallel embedding is split over TP; learned positions are replicated on the first stage.
The last stage holds the final norm and either the untied output layer or, when PP > 1 and the
embeddings are tied, a second copy of the tied word embedding (DeepSpeed's TiedLayerSpec builds
the module again on that stage, without a position table). A MoE layer (config/moe.py) holds a
replicated router [E, h] and, in place of the MLP, num_experts / EP experts of the same
activation, width moe.ffn_hidden_size, with biases when add_bias_linear, and the shared expert
(moe.shared_expert_ffn_hidden_size, an MLP like the dense one: split over TP, replicated over
EP); `active_params` counts the top_k experts a token meets instead of all of them."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import List, Optional, Sequence

from megatron.config import ModelConfig, moe, variants
from megatron.config.model_math import padded_vocab_size
from megatron.planner.layout import stage_layers


@lru_cache(maxsize=256)
def padded_vocab(vocab_size: int, divisible_by: int, tp: int) -> int:
    """config.model_math.padded_vocab_size, cached (the search asks for it per layout)."""
    return padded_vocab_size(vocab_size, divisible_by, tp)


def _norm(m: ModelConfig) -> int:
    return variants.of(m, "norm").weight_params(m)


def _positions(m: ModelConfig) -> int:
    """The position table (learned), replicated on the first stage; none for rotary."""
    return variants.of(m, "position").weight_params(m)


def _mlp(m: ModelConfig, ffn: int, tp: int) -> int:
    """One MLP (fc1 and fc2, their biases when add_bias_linear) of width ffn, on one TP rank."""
    h, bias = m.hidden_size, m.add_bias_linear
    fc1_rows = variants.of(m, "activation").fc1_factor * ffn // tp
    fc1 = fc1_rows * h + (fc1_rows if bias else 0)
    fc2 = h * (ffn // tp) + (h if bias else 0)
    return fc1 + fc2


def layer_params(m: ModelConfig, tp: int, index: int = -1, ep: int = 1,
                 active: bool = False) -> int:
    """Parameters of transformer layer `index` (-1: a dense layer) held by one TP rank (one of
    ep expert-parallel ranks); active: the top_k experts a token meets instead of the rank's."""
    h, bias = m.hidden_size, m.add_bias_linear
    qkv_rows = (m.num_attention_heads + 2 * m.kv_heads) * m.head_dim // tp
    qkv = qkv_rows * h + (qkv_rows if m.qkv_bias else 0)
    if m.attention.qk_norm:  # the norm's weights, each as wide as a head instead of the hidden size
        qkv += 2 * _norm(m) // m.hidden_size * m.head_dim
    proj = h * (m.num_attention_heads * m.head_dim // tp) + (h if bias else 0)
    core = variants.attention_of(m).weight_params(m, tp)
    if index >= 0 and moe.is_moe_layer(m, index):
        experts = m.moe.top_k if active else m.moe.num_experts // ep
        mlp = m.moe.num_experts * h + experts * _mlp(m, moe.expert_ffn(m), 1)
        if moe.shared_ffn(m):
            mlp += _mlp(m, moe.shared_ffn(m), tp)
    else:
        mlp = _mlp(m, m.ffn_hidden_size, tp)
    norms = 4 if m.residual.post_norms else 2  # model.residual: a norm after each sub-block
    return norms * _norm(m) + qkv + core + proj + mlp


def _layers(m: ModelConfig, tp: int, first: int, count: int, ep: int = 1,
            active: bool = False) -> int:
    """Parameters of layers [first, first + count) on one TP (and expert-parallel) rank."""
    if not m.moe.num_experts:
        return count * layer_params(m, tp)
    return sum(layer_params(m, tp, i, ep, active) for i in range(first, first + count))


def expert_params(m: ModelConfig, first: int, count: int, ep: int = 1) -> int:
    """Expert parameters one rank holds in layers [first, first + count): num_experts / ep
    whole experts of each MoE layer (the router is not an expert: it is replicated)."""
    per_layer = m.moe.num_experts // ep * _mlp(m, moe.expert_ffn(m), 1) if m.moe.num_experts else 0
    return per_layer * sum(moe.is_moe_layer(m, i) for i in range(first, first + count))


def layer_params_full(m: ModelConfig) -> int:
    return layer_params(m, 1)


@dataclass(frozen=True)
class StageParams:
    layers: int
    transformer: int
    word_embedding: int
    position_embedding: int
    output_layer: int   # untied output layer, or the tied embedding copy on the last stage
    final_norm: int

    @property
    def total(self) -> int:
        return (self.transformer + self.word_embedding + self.position_embedding
                + self.output_layer + self.final_norm)

    @property
    def max_layer(self) -> int:
        return self.transformer // self.layers if self.layers else 0


def stage_params(m: ModelConfig, tp: int, pp: int, stage: int, ep: int = 1,
                 counts: Optional[Sequence[int]] = None,
                 head_stage: Optional[int] = None) -> StageParams:
    """Parameters held by each TP rank of pipeline stage `stage` (0-based); ep: the
    expert-parallel size (parallel.expert_parallel_size); counts: layers per stage (default
    the even split, layout.stage_layers); head_stage: the stage with the output layer and
    final norm (default the last; Layout.head_stage)."""
    counts = list(counts) if counts is not None else stage_layers(m.num_layers, pp)
    layers = counts[stage]
    first, last = stage == 0, stage == (pp - 1 if head_stage is None else head_stage)
    embed = padded_vocab(m.vocab_size, m.make_vocab_size_divisible_by, tp) * m.hidden_size // tp
    output = 0
    if last and not m.tie_embeddings:
        output = embed
    elif last and pp > 1:
        output = embed
    return StageParams(layers=layers, transformer=_layers(m, tp, sum(counts[:stage]), layers, ep),
                       word_embedding=embed if first else 0,
                       position_embedding=_positions(m) if first else 0,
                       output_layer=output, final_norm=_norm(m) if last else 0)


def all_stage_params(m: ModelConfig, tp: int, pp: int, ep: int = 1,
                     counts: Optional[Sequence[int]] = None,
                     head_stage: Optional[int] = None) -> List[StageParams]:
    return [stage_params(m, tp, pp, s, ep, counts, head_stage) for s in range(pp)]


def model_params(m: ModelConfig, active: bool = False) -> int:
    """Unique parameters of the whole model (tied embeddings counted once, no padding); active:
    those one token meets (the top_k experts of each MoE layer, not all)."""
    h = m.hidden_size
    total = _layers(m, 1, 0, m.num_layers, active=active) + m.vocab_size * h + _norm(m) \
        + _positions(m)
    if not m.tie_embeddings:
        total += m.vocab_size * h
    return total


def active_params(m: ModelConfig) -> int:
    """Parameters one token meets: model_params for a dense model."""
    return model_params(m, active=True)
