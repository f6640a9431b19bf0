"""Training FLOPs: model FLOPs (what MFU counts) and hardware FLOPs (with recompute).

Narayanan et al. 2021: 72*B*s*L*h^2*(1 + s/(6h) + V/(12*L*h)) for a GPT with MHA and a 4h GeLU
MLP. Written per token and layer it is 3 * (2 * matmul parameters + 4*s*h attention) plus the
logits' 3 * 2*h*V, which extends exactly to GQA (smaller K/V projections), SwiGLU (three FFN
matrices) and any FFN width; the attention-score term depends on the query heads only."""
from __future__ import annotations

from megatron.config import ModelConfig


def layer_matmul_params(m: ModelConfig) -> int:
    h, d = m.hidden_size, m.head_dim
    qkv = h * (m.num_attention_heads + 2 * m.kv_heads) * d
    proj = h * m.num_attention_heads * d
    mlp = (3 if m.activation == "swiglu" else 2) * h * m.ffn_hidden_size
    return qkv + proj + mlp


def layer_forward_flops_per_token(m: ModelConfig) -> float:
    attn_scores = 4 * m.seq_length * m.num_attention_heads * m.head_dim
    return 2 * layer_matmul_params(m) + attn_scores


def attention_forward_flops_per_token(m: ModelConfig) -> float:
    return 4 * m.seq_length * m.num_attention_heads * m.head_dim


def model_flops(m: ModelConfig, sequences: int) -> float:
    """Forward + backward FLOPs of `sequences` sequences; recompute not counted."""
    tokens = sequences * m.seq_length
    per_token = m.num_layers * layer_forward_flops_per_token(m) + 2 * m.hidden_size * m.vocab_size
    return 3 * tokens * per_token


def hardware_flops(m: ModelConfig, sequences: int, recompute: str) -> float:
    """Model FLOPs plus what activation recomputation runs again (one forward of every layer
    for full recompute, the attention core for selective)."""
    tokens = sequences * m.seq_length
    extra = 0.0
    if recompute == "full":
        extra = m.num_layers * layer_forward_flops_per_token(m)
    elif recompute == "selective":
        extra = m.num_layers * attention_forward_flops_per_token(m)
    return model_flops(m, sequences) + tokens * extra


def narayanan_flops(batch: int, s: int, layers: int, h: int, vocab: int) -> float:
    return 72 * batch * s * layers * h ** 2 * (1 + s / (6 * h) + vocab / (12 * layers * h))
