"""Hugging Face model configs (config.json) as this project's `model:` section: GPT-2, Llama,
Mistral (its sliding window too), Qwen2, Qwen3, Qwen3-MoE and Mixtral, field for field, with
the options this model does not implement refused by name. Torch-free: the weights' import
(checkpoint/hf_import.py) and the planner (`megatron-plan --model path/to/config.json`) read
models through it."""
from __future__ import annotations

import json
import os
from typing import Any, Dict

from megatron.config import build_config, variants
from megatron.config.errors import ConfigError, InputError


def read_hf_config(path: str) -> Dict[str, Any]:
    """A Hugging Face model folder's config.json (or the file itself), as a dict."""
    hf_dir = path
    if path.lower().endswith(".json") and not os.path.isfile(path):
        raise InputError(f"{path!r} does not exist: expected a Hugging Face config.json or the "
                         f"model folder that holds one")
    if os.path.isfile(path):
        hf_dir = os.path.dirname(path) or "."
    else:
        path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(path):
        raise InputError(f"{hf_dir!r} holds no config.json: expected a Hugging Face model folder "
                         f"(config.json and model.safetensors)")
    try:
        with open(path) as f:
            hf = json.load(f)
    except ValueError as e:
        raise InputError(f"{path} is not JSON ({e}): expected a Hugging Face config.json") from None
    if not isinstance(hf, dict):
        raise InputError(f"{path} holds a JSON {type(hf).__name__}, not an object: expected a "
                         f"Hugging Face config.json")
    return hf


def hf_model_config(hf: Dict[str, Any], where: str, **fields):
    """The checked Config whose model section a Hugging Face config describes (fields: model
    values to set beside it, a planner's sequence length); errors name `where`."""
    try:
        section = dict(model_section(hf), **fields)
    except KeyError as e:
        raise InputError(f"{where} lacks {e.args[0]!r}, which a {hf.get('model_type')} "
                         f"config.json holds: expected the config save_pretrained writes") from None
    try:
        return build_config({"model": section})
    except ConfigError as e:  # a value of the folder's, not a field --set could change
        raise InputError(f"{where} describes a model this trainer refuses: {e.field}="
                         f"{e.value!r}, expected {e.expected}") from None


def _unsupported(field: str, value, expected: str):
    return InputError(f"Hugging Face config {field}={value!r} is not supported: expected "
                      f"{expected}")


def model_section(hf: Dict[str, Any]) -> Dict[str, Any]:
    """The `model:` section (typed values) for the model a Hugging Face config describes."""
    kind = hf.get("model_type")
    if kind == "gpt2":
        if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
            raise _unsupported("activation_function", hf.get("activation_function"),
                               "gelu_new (tanh GeLU)")
        if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("reorder_and_upcast_attn"):
            raise _unsupported("scale_attn_by_inverse_layer_idx", True, "false")
        h = hf["n_embd"]
        return {"num_layers": hf["n_layer"], "hidden_size": h,
                "num_attention_heads": hf["n_head"],
                "ffn_hidden_size": hf.get("n_inner") or 4 * h,
                "max_position_embeddings": hf["n_positions"],
                "vocab_size": hf["vocab_size"],
                "norm_epsilon": float(hf.get("layer_norm_epsilon", 1e-5)),
                **variants.of_architecture("gpt2"), "add_bias_linear": True,
                "tie_embeddings": True}
    if kind == "mixtral":
        return _mixtral_section(hf)
    if kind in ("gemma3_text", "gemma3"):
        return _gemma3_section(gemma3_text_config(hf))
    if kind == "gemma2":
        return _gemma2_section({**GEMMA2_DEFAULTS, **hf})
    if kind in ("qwen2", "qwen3"):
        return _qwen_section(hf, kind)
    if kind == "qwen3_moe":
        return _qwen3_moe_section(hf)
    if kind == "mistral":  # Llama's weights and settings, every layer within its window
        return _windowed(_llama_section(dict(hf, attention_bias=False, mlp_bias=False)), hf)
    if kind != "llama":
        raise _unsupported("model_type", kind, "gpt2, llama, mistral, qwen2, qwen3, qwen3_moe, "
                           "mixtral, gemma2, gemma3_text or gemma3")
    return _llama_section(hf)


def _qwen3_moe_section(hf: Dict[str, Any]) -> Dict[str, Any]:
    """Qwen3's fields with experts in every layer: the router's softmax renormalised over the
    chosen experts where norm_topk_prob says so. Dense layers among the experts
    (decoder_sparse_step > 1, mlp_only_layers) are refused: their phase is not model.moe's."""
    if hf.get("decoder_sparse_step", 1) != 1:
        raise _unsupported("decoder_sparse_step", hf["decoder_sparse_step"], "1 (experts in "
                           "every layer)")
    if hf.get("mlp_only_layers"):
        raise _unsupported("mlp_only_layers", hf["mlp_only_layers"], "[] (experts in every "
                           "layer)")
    experts = hf.get("num_experts", hf.get("num_local_experts"))
    if experts is None:
        raise KeyError("num_experts")
    return dict(_qwen_section(hf, "qwen3"),
                moe={"num_experts": experts, "top_k": hf["num_experts_per_tok"], "layer_freq": 1,
                     "ffn_hidden_size": hf["moe_intermediate_size"],
                     "router": "softmax_renorm" if hf.get("norm_topk_prob") else "softmax",
                     "aux_loss_coeff": float(hf.get("router_aux_loss_coef", 0.001))})


def _qwen_section(hf: Dict[str, Any], kind: str) -> Dict[str, Any]:
    """Llama's fields; Qwen2's q, k and v with biases (its o_proj and MLP without), Qwen3's
    per-head q and k norms (attention_bias, which would put biases on q, k, v and o but none
    on the MLP, is refused)."""
    if hf.get("use_sliding_window"):
        raise _unsupported("use_sliding_window", True, "false (full attention)")
    if kind == "qwen2":
        out = _llama_section(dict(hf, attention_bias=False, mlp_bias=False))
        return dict(out, attention=dict(out.get("attention", {}), add_qkv_bias=True))
    if hf.get("attention_bias"):
        raise _unsupported("attention_bias", True, "false (Qwen3 has no MLP biases, and one "
                           "setting covers every linear layer here but q, k and v)")
    out = _llama_section(dict(hf, mlp_bias=False))
    return dict(out, attention=dict(out.get("attention", {}), qk_norm=True))


def _mixtral_section(hf: Dict[str, Any]) -> Dict[str, Any]:
    """Llama's fields, with experts in every layer and Mixtral's renormalised softmax router."""
    if hf.get("router_jitter_noise"):
        raise _unsupported("router_jitter_noise", hf["router_jitter_noise"], "0")
    out = _windowed(_llama_section(dict(hf, mlp_bias=hf.get("attention_bias", False))), hf)
    return dict(out, moe={"num_experts": hf.get("num_local_experts", 8),
                          "top_k": hf.get("num_experts_per_tok", 2), "layer_freq": 1,
                          "router": "softmax_renorm",
                          "aux_loss_coeff": float(hf.get("router_aux_loss_coef", 0.001))})


# Gemma3TextConfig's defaults (transformers), which a hub config.json leaves out: the image-text
# models' text_config holds only what differs from them.
GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
                        "num_hidden_layers": 26, "num_attention_heads": 8,
                        "num_key_value_heads": 4, "head_dim": 256,
                        "hidden_activation": "gelu_pytorch_tanh",
                        "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
                        "rope_theta": 1e6, "rope_local_base_freq": 1e4,
                        "query_pre_attn_scalar": 256, "sliding_window": 4096,
                        "sliding_window_pattern": 6, "tie_word_embeddings": True}


def gemma3_text_config(hf: Dict[str, Any]) -> Dict[str, Any]:
    """A Gemma 3 config.json's text model with Gemma3TextConfig's defaults filled in: the
    file itself (gemma3_text: 1B, 270M), or the text_config of an image-text one (gemma3: 4B,
    12B, 27B, whose vision tower the import leaves out)."""
    if hf.get("model_type") == "gemma3":
        text = dict(hf.get("text_config") or {}, model_type="gemma3_text")
        text.setdefault("tie_word_embeddings", hf.get("tie_word_embeddings", True))
        hf = text
    return {**GEMMA3_TEXT_DEFAULTS, **hf}


# Gemma2Config's defaults (transformers): a config.json written before layer_types existed
# (transformers 4.42-4.52) leaves every other layer global by this pattern.
GEMMA2_DEFAULTS = {"vocab_size": 256000, "head_dim": 256, "max_position_embeddings": 8192,
                   "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
                   "rope_theta": 1e4, "query_pre_attn_scalar": 256, "sliding_window": 4096,
                   "sliding_window_pattern": 2, "attn_logit_softcapping": 50.0,
                   "final_logit_softcapping": 30.0, "tie_word_embeddings": True}


def _gemma3_section(hf: Dict[str, Any]) -> Dict[str, Any]:
    """Gemma 3 (text): Gemma's layer (_gemma_section) with per-head q and k norms, and the
    windowed layers' own rotary base."""
    full, local = _gemma3_rope(hf)
    section = _gemma_section(hf, full, qk_norm=True)
    if section["attention"]["sliding_window"] and local.get("rope_type", "default") != "default":
        raise _unsupported("rope_parameters.sliding_attention", local, "rope_type default")
    if section["attention"]["sliding_window"]:
        section["attention"]["window_rotary_base"] = float(local.get("rope_theta", 10000.0))
    return section


def _gemma2_section(hf: Dict[str, Any]) -> Dict[str, Any]:
    """Gemma 2: Gemma's layer (_gemma_section) without q and k norms, one rotary base for every
    layer (transformers 5's rope_parameters, or 4's rope_theta), the attention scores and the
    logits capped by default (50 and 30)."""
    rope = dict(hf.get("rope_scaling") or {}, **(hf.get("rope_parameters") or {}))
    rope.setdefault("rope_theta", hf.get("rope_theta", 1e4))
    return _gemma_section(hf, rope, qk_norm=False)


def _gemma_section(hf: Dict[str, Any], rope: Dict[str, Any], qk_norm: bool) -> Dict[str, Any]:
    """Gemma 2's and 3's shared layer: Llama's shape with GeGLU, norms after the attention and
    the MLP, the embedding times sqrt(hidden), every N-th layer global (layer_types),
    query_pre_attn_scalar^-0.5 as the scores' scale where it is not the head width's, and the
    scores' and logits' caps (attn_logit_softcapping, final_logit_softcapping; null: none).
    Bidirectional attention and biases are refused."""
    act = hf.get("hidden_activation", hf.get("hidden_act", "gelu_pytorch_tanh"))
    if act != "gelu_pytorch_tanh":
        raise _unsupported("hidden_activation", act, "gelu_pytorch_tanh (GeGLU)")
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    for name, want in (("use_bidirectional_attention", False), ("attention_bias", False)):
        if hf.get(name) is not None and hf.get(name) != want:
            raise _unsupported(name, hf.get(name), repr(want))
    section = _llama_section(dict(hf, hidden_act="silu", rope_parameters=rope, rope_scaling=None,
                                  rope_theta=rope["rope_theta"], mlp_bias=False))
    window, pattern = _gemma3_layers(hf)
    attention = dict(section.get("attention", {}), qk_norm=qk_norm, sliding_window=window,
                     sliding_window_pattern=pattern,
                     logit_softcapping=float(hf.get("attn_logit_softcapping") or 0.0))
    scalar = hf.get("query_pre_attn_scalar") or head_dim
    if scalar != head_dim:  # Gemma 3 27B: 168 with heads of 128; Gemma 2 27B: 144
        attention["softmax_scale"] = float(scalar) ** -0.5
    return dict(section, **variants.of_architecture("gemma3"), attention=attention,
                residual={"post_norms": True, "embedding_multiplier": hf["hidden_size"] ** 0.5},
                output={"logit_softcapping": float(hf.get("final_logit_softcapping") or 0.0)})


def _gemma3_rope(hf: Dict[str, Any]):
    """(the global layers' rope dictionary, the windowed layers'): transformers 5's
    rope_parameters per layer type, or 4's rope_theta, rope_scaling and rope_local_base_freq."""
    rope = hf.get("rope_parameters") or {}
    if "full_attention" in rope:
        return rope["full_attention"], rope.get("sliding_attention", rope["full_attention"])
    full = dict(hf.get("rope_scaling") or {}, rope_theta=hf.get("rope_theta", 1e6))
    return full, {"rope_type": "default", "rope_theta": hf.get("rope_local_base_freq", 1e4)}


def _gemma3_layers(hf: Dict[str, Any]):
    """(sliding_window, sliding_window_pattern) for layer_types: every N-th layer global, the
    rest windowed (Gemma 3's 6); no windowed layer: no window."""
    n = hf["num_hidden_layers"]
    types = hf.get("layer_types") or [
        "full_attention" if (i + 1) % hf.get("sliding_window_pattern", 6) == 0
        else "sliding_attention" for i in range(n)]
    if "sliding_attention" not in types:
        return 0, 0
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    pattern = full[0] + 1 if full else 0
    every_nth = [bool(pattern) and (i + 1) % pattern == 0 for i in range(n)]
    if [t == "full_attention" for t in types] != every_nth:
        raise _unsupported("layer_types", types, "every N-th layer full_attention and the others "
                           "sliding_attention (model.attention.sliding_window_pattern)")
    return hf["sliding_window"], pattern


def _windowed(section: Dict[str, Any], hf: Dict[str, Any]) -> Dict[str, Any]:
    """The section with Mistral's and Mixtral's sliding_window (every layer; null: none)."""
    window = hf.get("sliding_window")
    if not window:
        return section
    return dict(section, attention=dict(section.get("attention", {}), sliding_window=window))


def _llama_section(hf: Dict[str, Any]) -> Dict[str, Any]:
    h, heads = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim")
    # transformers 5's rope_parameters, or 4's rope_theta beside a rope_scaling ("type" before
    # 4.45)
    rope = dict(hf.get("rope_scaling") or {}, **(hf.get("rope_parameters") or {}))
    scaling = _rope_scaling(rope)
    if hf.get("hidden_act", "silu") != "silu":
        raise _unsupported("hidden_act", hf.get("hidden_act"), "silu (SwiGLU)")
    bias = bool(hf.get("attention_bias", False))
    if bool(hf.get("mlp_bias", False)) != bias:
        raise _unsupported("mlp_bias", hf.get("mlp_bias"), f"equal to attention_bias ({bias}): "
                           f"one setting covers every linear layer here")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    return {"num_layers": hf["num_hidden_layers"], "hidden_size": h,
            "num_attention_heads": heads,
            "num_query_groups": hf.get("num_key_value_heads") or heads,
            "ffn_hidden_size": hf["intermediate_size"],
            "max_position_embeddings": hf["max_position_embeddings"],
            "vocab_size": hf["vocab_size"],
            "norm_epsilon": float(hf.get("rms_norm_eps", 1e-6)),
            "rotary_base": float(theta), **variants.of_architecture("llama"),
            **({"rope_scaling": scaling} if scaling else {}),
            "add_bias_linear": bias,
            # a head width apart from hidden / heads (Qwen3 0.6B: 1024 / 16 = 64, heads of 128)
            **({"attention": {"kv_channels": head_dim}}
               if head_dim not in (None, h // heads) or h % heads else {}),
            "tie_embeddings": bool(hf.get("tie_word_embeddings", False))}


def _rope_scaling(rope: Dict[str, Any]) -> Dict[str, Any]:
    """model.rope_scaling for a Hugging Face rope dictionary: {} for plain rotary; linear and
    Llama 3.1's llama3 mapped field for field; other kinds (yarn, dynamic, longrope) refused."""
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return {}
    if kind not in ("linear", "llama3"):
        raise _unsupported("rope_scaling", rope, "rope_type default, linear or llama3 (the "
                           "scalings model.rope_scaling implements)")
    out = {"type": kind, "factor": float(rope["factor"])}
    if kind == "llama3":
        out.update(low_freq_factor=float(rope["low_freq_factor"]),
                   high_freq_factor=float(rope["high_freq_factor"]),
                   original_max_position_embeddings=int(
                       rope["original_max_position_embeddings"]))
    return out


__all__ = ["hf_model_config", "model_section", "read_hf_config"]
