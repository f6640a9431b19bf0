"""Model presets: the paper's 22B/175B/1T and the GPT-3 family, as ModelConfig objects; and a
Hugging Face config.json in their place (Llama, Qwen, Mixtral, Qwen3-MoE: config/hf_models.py).

The paper's shapes come from the authors' public scripts (GPT-2 BPE vocabulary, sequence 2048,
learned positions, LayerNorm, GeLU, biases, tied embeddings, Megatron's 0.1 dropouts). The GPT-3
family follows Brown et al. 2020 table 2.1, with head counts that divide the hidden size."""
from __future__ import annotations

import os
from typing import Dict, Tuple

from megatron.config import ModelConfig, variants
from megatron.config.errors import ConfigError

GPT2_VOCAB = 50257

# name -> (layers, hidden, heads)
_SHAPES: Dict[str, Tuple[int, int, int]] = {
    "22b": (48, 6144, 48),
    "175b": (96, 12288, 96),
    "1t": (128, 25600, 200),
    "gpt3-125m": (12, 768, 12),
    "gpt3-350m": (24, 1024, 16),
    "gpt3-760m": (24, 1536, 16),
    "gpt3-1.3b": (24, 2048, 16),
    "gpt3-2.7b": (32, 2560, 32),
    "gpt3-6.7b": (32, 4096, 32),
    "gpt3-13b": (40, 5120, 40),
    "gpt3-175b": (96, 12288, 96),
}

MODEL_PRESETS = tuple(_SHAPES)


def is_hf_config(name: str) -> bool:
    """Whether --model names a Hugging Face config.json, or a model folder holding one."""
    return name.lower().endswith(".json") or os.path.isfile(os.path.join(name, "config.json"))


def hf_model(path: str, seq_length: int) -> ModelConfig:
    """The model a Hugging Face config.json describes (config/hf_models.py), at seq_length."""
    from megatron.config.hf_models import hf_model_config, read_hf_config
    hf = read_hf_config(path)
    longest = max(seq_length, int(hf.get("max_position_embeddings") or seq_length))
    return hf_model_config(hf, path, seq_length=seq_length,
                           max_position_embeddings=longest).model


def preset_model(name: str, seq_length: int = 2048) -> ModelConfig:
    """A preset by name, or the model of a Hugging Face config.json (is_hf_config)."""
    key = name.lower()
    if key not in _SHAPES and is_hf_config(name):
        return hf_model(name, seq_length)
    if key not in _SHAPES:
        if key.endswith((".yaml", ".yml")):
            # a file passed where a preset goes: say where it belongs, and whether it is there
            missing = "" if os.path.isfile(name) else f" (there is no file {name!r} either)"
            fix = f"a training config goes to --config: pass --config {name}{missing}"
        else:
            fix = "pick a preset, or pass a training config with --config FILE.yaml"
        raise ConfigError("--model", name, f"a preset among {', '.join(MODEL_PRESETS)}, or a "
                          f"Hugging Face config.json (or its model folder)", fix)
    layers, hidden, heads = _SHAPES[key]
    return ModelConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                       seq_length=seq_length, max_position_embeddings=seq_length,
                       vocab_size=GPT2_VOCAB, make_vocab_size_divisible_by=128,
                       **variants.of_architecture("gpt2"), add_bias_linear=True,
                       tie_embeddings=True,
                       hidden_dropout=0.1, attention_dropout=0.1, attention_backend="auto")
