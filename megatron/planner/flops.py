"""Training FLOPs of a step: model FLOPs (what MFU counts) and hardware FLOPs (with recompute),
from the per-token formula in megatron/config/model_math.py (the trainer's too)."""
from __future__ import annotations

from megatron.config import ModelConfig
from megatron.config.model_math import (attention_forward_flops_per_token,
                                        layer_forward_flops_per_token, model_flops_per_token)


def model_flops(m: ModelConfig, sequences: int) -> float:
    """Forward + backward FLOPs of `sequences` sequences; recompute not counted."""
    return sequences * m.seq_length * model_flops_per_token(m, m.vocab_size)


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
