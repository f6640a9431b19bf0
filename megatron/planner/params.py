"""Exact parameter counts per rank, following this project's GPT (megatron/model/gpt.py).

Pre-norm decoder. Per layer: norm1; fused QKV, column-parallel, [(heads + 2*kv) * head_dim, h];
the attention core's own weights, if its record declares any; attention output, row-parallel,
[h, h]; norm2; MLP fc1 column-parallel ([fc1_factor * ffn, h]: 1 for GeLU, 2 for SwiGLU) and
fc2 row-parallel [h, ffn]. Norms, cores and position tables count what their variant records
declare (config/variants.py). Column-parallel weights and biases and
the row-parallel weights are split over TP; norms and row-parallel biases are replicated. The
vocab-parallel embedding is split over TP; learned positions are replicated on the first stage.
The last stage holds the final norm and either the untied output layer or, when PP > 1 and the
embeddings are tied, a second copy of the tied word embedding (DeepSpeed's TiedLayerSpec builds
the module again on that stage, without a position table)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import List

from megatron.config import ModelConfig, variants
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


def layer_params(m: ModelConfig, tp: int) -> int:
    """Parameters of one transformer layer held by one TP rank."""
    h, bias = m.hidden_size, m.add_bias_linear
    qkv_rows = (m.num_attention_heads + 2 * m.kv_heads) * m.head_dim // tp
    qkv = qkv_rows * h + (qkv_rows if bias else 0)
    proj = h * (m.num_attention_heads * m.head_dim // tp) + (h if bias else 0)
    fc1_rows = variants.of(m, "activation").fc1_factor * m.ffn_hidden_size // tp
    fc1 = fc1_rows * h + (fc1_rows if bias else 0)
    fc2 = h * (m.ffn_hidden_size // tp) + (h if bias else 0)
    core = variants.attention_of(m).weight_params(m, tp)
    return 2 * _norm(m) + qkv + core + proj + fc1 + fc2


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


def stage_params(m: ModelConfig, tp: int, pp: int, stage: int) -> StageParams:
    """Parameters held by each TP rank of pipeline stage `stage` (0-based)."""
    layers = stage_layers(m.num_layers, pp)[stage]
    first, last = stage == 0, stage == pp - 1
    embed = padded_vocab(m.vocab_size, m.make_vocab_size_divisible_by, tp) * m.hidden_size // tp
    output = 0
    if last and not m.tie_embeddings:
        output = embed
    elif last and pp > 1:
        output = embed
    return StageParams(layers=layers, transformer=layers * layer_params(m, tp),
                       word_embedding=embed if first else 0,
                       position_embedding=_positions(m) if first else 0,
                       output_layer=output, final_norm=_norm(m) if last else 0)


def all_stage_params(m: ModelConfig, tp: int, pp: int) -> List[StageParams]:
    return [stage_params(m, tp, pp, s) for s in range(pp)]


def model_params(m: ModelConfig) -> int:
    """Unique parameters of the whole model (tied embeddings counted once, no padding)."""
    h = m.hidden_size
    total = m.num_layers * layer_params_full(m) + m.vocab_size * h + _norm(m) + _positions(m)
    if not m.tie_embeddings:
        total += m.vocab_size * h
    return total
