"""Arithmetic on a model config that the trainer, the planner and the benchmarks share, kept here
once and free of torch (planning must not pay for importing it): vocabulary padding and training
FLOPs per token.

FLOPs (Narayanan et al. 2021): 72*B*s*L*h^2*(1 + s/(6h) + V/(12*L*h)) for a GPT with MHA and a 4h
GeLU MLP. Written per token and layer it is 3 * (2 * matmul parameters + 4*s*h attention) plus the
logits' 3 * 2*h*V, which extends exactly to GQA (smaller K/V projections), SwiGLU (three FFN
matrices) and any FFN width; the attention-score term depends on the query heads only, and the
causal mask is not halved (as Megatron counts); a sliding window's layers count the share of
the causal pairs their band holds (attention_keys). A MoE layer (config/moe.py) counts the FLOPs a
token really costs: its router (h x E), the top_k experts it is sent to, not all E, and the
shared expert every token runs (model.moe.shared_expert_ffn_hidden_size)."""
from __future__ import annotations

from typing import List, Optional, Tuple

from megatron.config import moe, variants

# The sdpa and math cores attend a windowed layer in bands of queries (model/attention_cores.py)
# of at least this many
BAND_BLOCK = 256


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    """As Megatron pads: a multiple of make_vocab_size_divisible_by x TP, so each tensor-parallel
    rank holds an equal, GEMM-friendly slice of the embedding."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


def layer_matmul_params(m, index: int = -1) -> int:
    """Matmul weights one token meets in layer `index` (-1: a dense layer): for a MoE layer the
    router, top_k experts and the shared expert, if any (the active parameters)."""
    h, d = m.hidden_size, m.head_dim
    qkv = h * (m.num_attention_heads + 2 * m.kv_heads) * d
    proj = h * m.num_attention_heads * d
    fc = variants.of(m, "activation").fc1_factor + 1
    if index >= 0 and moe.is_moe_layer(m, index):
        return qkv + proj + h * m.moe.num_experts + fc * h * (
            m.moe.top_k * moe.expert_ffn(m) + moe.shared_ffn(m))
    return qkv + proj + fc * h * m.ffn_hidden_size


def attention_keys(m) -> float:
    """Keys a query's scores are counted over, the mean over the layers: the sequence (the
    causal mask not halved, as Megatron counts), or under model.attention.sliding_window w < s
    the same share of what the window leaves, 2 w - w^2 / s (a causal band of width w holds
    s w - w^2 / 2 of the s^2 / 2 pairs), on the layers the window covers."""
    s = m.seq_length
    if not m.attention.sliding_window:
        return float(s)
    keys = [s if w is None or w >= s else 2 * w - w * w / s
            for w in (m.attention.window_of(i) for i in range(m.num_layers))]
    return sum(keys) / len(keys)


def band_blocks(s: int, window: Optional[int], packed: bool = False
                ) -> Optional[List[Tuple[int, int, int]]]:
    """The bands the sdpa and math cores attend a layer of s queries in under a sliding window
    (or, packed, with documents: model/attention_cores.attention_bands narrows them to each
    band's documents): blocks of max(window, BAND_BLOCK) queries [q0, q1), each against keys
    [k0, q1) from its first query's window on (from 0 without one); None (the whole sequence at
    once) with neither, or where the sequence spans two blocks or fewer."""
    if not window and not packed:
        return None
    block = max(window or 0, BAND_BLOCK)
    if s <= 2 * block:
        return None
    return [(q0, min(q0 + block, s), max(0, q0 - window + 1) if window else 0)
            for q0 in range(0, s, block)]


def masked_keys(m) -> float:
    """Keys a query's scores are computed over by the sdpa and math cores (which compute a
    block's every score and mask what it hides), the mean over the layers: the sequence, or
    on a windowed layer attended in bands the band's keys (band_blocks)."""
    s = m.seq_length
    keys = []
    for i in range(m.num_layers):
        bands = band_blocks(s, m.attention.window_of(i))
        keys.append(s if bands is None else
                    sum((q1 - q0) * (q1 - k0) for q0, q1, k0 in bands) / s)
    return sum(keys) / len(keys)


def attention_forward_flops_per_token(m) -> float:
    """Scores and context: 2 matmuls of 2*keys*d per query head (attention_keys; a core may
    declare its own)."""
    core = variants.attention_of(m)
    if core.flops_per_token is not None:
        return core.flops_per_token(m)
    return 4 * attention_keys(m) * m.num_attention_heads * m.head_dim


def layer_forward_flops_per_token(m, index: int = -1) -> float:
    return 2 * layer_matmul_params(m, index) + attention_forward_flops_per_token(m)


def model_flops_per_token(m, vocab_size: int) -> float:
    """Training FLOPs per token (forward + backward = 3 x forward), counting only model math:
    recomputation adds hardware FLOPs, not model FLOPs (MFU)."""
    if m.moe.num_experts:
        layers = sum(layer_forward_flops_per_token(m, i) for i in range(m.num_layers))
    else:
        layers = m.num_layers * layer_forward_flops_per_token(m)
    return 3.0 * (layers + 2 * m.hidden_size * vocab_size)
