"""Hugging Face export: a merged checkpoint (convert.merge_run) written as a transformers model
folder, config.json plus model.safetensors, for evaluation harnesses (lm-eval's `hf` model) and
the rest of that ecosystem. These flavours map exactly, weight for weight:

- GPT-2 (learned positions, LayerNorm, tanh GeLU, biases, tied embeddings, one key/value head
  per query head) -> GPT2LMHeadModel. Its Conv1D weights are stored [in, out] (transposed), and
  its c_attn holds all queries, then all keys, then all values, where our QKV rows are grouped
  per head.
- Llama (rotary over the whole head, RMSNorm, SwiGLU; any number of key/value groups; tied or
  untied; biases on or off) -> LlamaForCausalLM. q/k/v and gate/up are split out of our fused
  QKV (per group: its query heads, then its key, then its value) and [gate; up] fc1.
- Qwen2 (the Llama settings with biases on q, k and v alone: add_bias_linear=false,
  add_qkv_bias=true) -> Qwen2ForCausalLM; Qwen3 (no biases, each head's q and k normalised:
  qk_norm=true) -> Qwen3ForCausalLM, its q_norm and k_norm from ours. Llama and Qwen3 carry a
  head width apart from hidden / heads (model.attention.kv_channels) as head_dim.
- Qwen3-MoE (Qwen3's attention with experts in every layer, no shared expert; the router's
  softmax plain or renormalised over the chosen experts: norm_topk_prob) ->
  Qwen3MoeForCausalLM, the experts in the hub's layout (mlp.gate, mlp.experts.<e>.gate_proj /
  up_proj / down_proj).
- Mistral (the Llama settings without biases, every layer within one sliding window:
  model.attention.sliding_window, sliding_window_pattern=0) -> MistralForCausalLM; a model
  without a window is written as Llama.
- Gemma 3, text (rotary, RMSNorm, GeGLU, no biases, per-head q and k norms, norms after the
  attention and the MLP and the embedding times sqrt(hidden): model.residual; every N-th layer
  global, the others in a window, with their own rotary base) -> Gemma3ForCausalLM; its norms
  store the offset from 1 (weight - 1). Gemma 2 (the same without q and k norms, one rotary
  base; the scores and the logits capped: model.attention.logit_softcapping,
  model.output.logit_softcapping) -> Gemma2ForCausalLM.
- Mixtral (the Llama settings with experts in every layer, model.moe.layer_freq=1, no biases,
  model.moe.router=softmax_renorm: Mixtral renormalises its top-k softmax weights, which our
  plain softmax router does not) -> MixtralForCausalLM, written in the Hugging Face hub's layout
  (block_sparse_moe.gate, experts.<e>.w1/w3/w2: gate, up, down), which transformers 5 folds into
  its stacked experts on load and transformers 4 reads as is. Mixtral runs dropless: a model
  trained with model.moe.capacity_factor gives the same logits only where no expert overflows.

The vocabulary keeps the rows the merge kept (padding included unless trimmed), so the exported
model gives the trained model's logits. Tokenizer files named in the run's config are copied
beside the weights (GPT-2 vocab.json/merges.txt, a Hugging Face tokenizer.json, or a SentencePiece
tokenizer.model). Writing needs no transformers; reading the result back does."""
from __future__ import annotations

import functools
import json
import os
import shutil
from typing import Dict, List

import torch

from megatron.base import store
from megatron.base.outputs import check_output
from megatron.config import moe, variants
from megatron.config.errors import InputError
from megatron.config.sections import field_at
from megatron.checkpoint.convert import MergedCheckpoint

StateDict = Dict[str, torch.Tensor]

# Beyond the variants (each selected norm, activation, position and attention core declares the
# architectures it maps to, config/variants.py), the fields each architecture fixes.
# (Llama's attention_bias covers q, k, v and o alike: q, k and v alone with biases are Qwen2's.)
# A tuple: any of its values.
_ROUTED = {"moe.layer_freq": 1, "moe.router_bias_update_rate": 0.0,
           "moe.shared_expert_ffn_hidden_size": None}
_FULL = {"attention.sliding_window": 0}  # every earlier key: no window field to hold one
# one window for every layer, or none; one rotary base
_ONE_WINDOW = {"attention.sliding_window_pattern": 0, "attention.window_rotary_base": None}
# a plain pre-norm layer (model.residual): only Gemma 2 and 3 hold norms after the sub-blocks,
# the scores' default scale (Gemma's query_pre_attn_scalar holds another) and no cap on the
# scores or the logits (Gemma's attn_logit_softcapping, final_logit_softcapping)
_PLAIN = {"residual.post_norms": False, "residual.embedding_multiplier": 1.0,
          "attention.softmax_scale": None, "attention.logit_softcapping": 0.0,
          "output.logit_softcapping": 0.0}
FIELD_NEEDS = {"gpt2": {"add_bias_linear": True, "tie_embeddings": True,
                        "attention.kv_channels": None, "attention.qk_norm": False, **_FULL,
                        **_PLAIN},
               "llama": {"attention.qk_norm": False, **_FULL, **_PLAIN},
               "mistral": {"add_bias_linear": False, "attention.add_qkv_bias": False,
                           "attention.qk_norm": False, **_ONE_WINDOW, **_PLAIN},
               "qwen2": {"add_bias_linear": False, "attention.add_qkv_bias": True,
                         "attention.qk_norm": False, **_FULL, **_PLAIN},
               "qwen3": {"add_bias_linear": False, "attention.add_qkv_bias": False,
                         "attention.qk_norm": True, **_FULL, **_PLAIN},
               "qwen3_moe": {"add_bias_linear": False, "attention.add_qkv_bias": False,
                             "attention.qk_norm": True,
                             "moe.router": ("softmax", "softmax_renorm"), **_ROUTED, **_FULL,
                             **_PLAIN},
               "mixtral": {"add_bias_linear": False, "attention.add_qkv_bias": False,
                           "attention.qk_norm": False, "moe.router": "softmax_renorm",
                           **_ROUTED, **_ONE_WINDOW, **_PLAIN},
               # the embedding's multiplier, sqrt(hidden), is checked in _arch_problems
               "gemma3": {"add_bias_linear": False, "attention.add_qkv_bias": False,
                          "attention.qk_norm": True, "residual.post_norms": True},
               # one rotary base for every layer
               "gemma2": {"add_bias_linear": False, "attention.add_qkv_bias": False,
                          "attention.qk_norm": False, "residual.post_norms": True,
                          "attention.window_rotary_base": None}}
ARCH_NAMES = {"gpt2": "GPT-2", "llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2",
              "qwen3": "Qwen3", "qwen3_moe": "Qwen3-MoE", "mixtral": "Mixtral",
              "gemma2": "Gemma 2", "gemma3": "Gemma 3"}
MOE_ARCHS = ("qwen3_moe", "mixtral")
# Mistral's, Mixtral's and Qwen's attention, norm, rotary and SwiGLU are Llama's: the variants'
# Llama names serve them.
VARIANT_ARCH = {"mistral": "llama", "mixtral": "llama", "qwen2": "llama", "qwen3": "llama",
                "qwen3_moe": "llama", "gemma2": "gemma3"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _selected(m):
    """(config field, value, record) of each variant the model selects."""
    out = []
    for kind, name in variants.KIND_FIELD.items():
        v = variants.attention_of(m) if kind == "attention" else variants.of(m, kind)
        out.append((name, getattr(m, name), v))
    return out


def _arch_problems(m, arch: str) -> List[str]:
    why = [f"model.{name}={value!r} declares no {ARCH_NAMES[arch]} names"
           for name, value, v in _selected(m) if VARIANT_ARCH.get(arch, arch) not in v.hf]
    if (arch in MOE_ARCHS) != (m.moe.num_experts > 0):
        why.append(f"moe.num_experts={m.moe.num_experts} (needs "
                   f"{'> 0' if arch in MOE_ARCHS else '0: experts map to Mixtral or Qwen3-MoE'})")
    for k, v in FIELD_NEEDS[arch].items():
        if field_at(m, k) not in (v if isinstance(v, tuple) else (v,)):
            needs = " or ".join(map(repr, v)) if isinstance(v, tuple) else repr(v)
            why.append(f"{k}={field_at(m, k)!r} (needs {needs})")
    if arch == "llama" and m.qkv_bias != m.add_bias_linear:
        why.append(f"attention.add_qkv_bias={m.attention.add_qkv_bias!r} with add_bias_linear="
                   f"{m.add_bias_linear!r} (biases on q, k and v alone)")
    if arch in ("gemma2", "gemma3") and m.residual.embedding_multiplier != m.hidden_size ** 0.5:
        why.append(f"residual.embedding_multiplier={m.residual.embedding_multiplier!r} (needs "
                   f"sqrt(hidden_size) = {m.hidden_size ** 0.5!r})")
    if arch == "gpt2" and m.kv_heads != m.num_attention_heads:
        why.append(f"num_query_groups={m.kv_heads} of {m.num_attention_heads} heads (GPT-2 has "
                   "one key/value head per query head)")
    return why


def flavour(m) -> str:
    """'gpt2', 'llama', 'mistral', 'qwen2', 'qwen3', 'qwen3_moe', 'mixtral', 'gemma2' or 'gemma3'
    for a model config that maps exactly; InputError otherwise, naming what each architecture
    lacks."""
    problems = {}
    for arch in ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gemma2", "gemma3",
                 "gpt2"):
        problems[arch] = _arch_problems(m, arch)
        if not problems[arch]:
            return arch
    raise InputError("this model maps to no Hugging Face architecture exactly: "
                     + "; ".join(f"for {ARCH_NAMES[a]}, " + ", ".join(why)
                                 for a, why in problems.items())
                     + ". A variant of your own maps where its record names its Hugging Face "
                     "weights (config/variants.py, Variant.hf); otherwise keep the model as one "
                     "file: megatron-convert to-single")


def _norm_names(m, arch: str, ours: str, theirs: str, sd: StateDict) -> StateDict:
    """The norm at `ours` under its record's names for `arch`, at `theirs`."""
    names = variants.of(m, "norm").hf[arch]
    return {theirs + hf: sd[ours + mine] for mine, hf in names.items()}


def _qkv_parts(w: torch.Tensor, m) -> List[torch.Tensor]:
    """Our fused QKV rows (or bias) -> [q, k, v], each with heads in order."""
    groups, d = m.kv_heads, m.head_dim
    g = m.num_attention_heads // groups
    per_group = w.reshape(groups, g + 2, d, *w.shape[1:])
    q = per_group[:, :g].reshape(groups * g * d, *w.shape[1:])
    k = per_group[:, g].reshape(groups * d, *w.shape[1:])
    v = per_group[:, g + 1].reshape(groups * d, *w.shape[1:])
    return [q, k, v]


def gpt2_state_dict(sd: StateDict, m) -> StateDict:
    out = {"transformer.wte.weight": sd["embedding.word_embeddings.weight"]}
    positions = variants.of(m, "position").hf["gpt2"]
    out.update({"transformer." + hf: sd["embedding." + mine] for mine, hf in positions.items()})
    out.update(_norm_names(m, "gpt2", "final_norm.", "transformer.ln_f.", sd))
    for i in range(m.num_layers):
        ours, hf = f"layers.{i}.", f"transformer.h.{i}."
        out.update(_norm_names(m, "gpt2", ours + "norm1.", hf + "ln_1.", sd))
        out.update(_norm_names(m, "gpt2", ours + "norm2.", hf + "ln_2.", sd))
        out.update({
            # Conv1D: weight [in, out].
            hf + "attn.c_attn.weight": torch.cat(_qkv_parts(sd[ours + "attention.qkv.weight"], m)).t(),
            hf + "attn.c_attn.bias": torch.cat(_qkv_parts(sd[ours + "attention.qkv.bias"], m)),
            hf + "attn.c_proj.weight": sd[ours + "attention.dense.weight"].t(),
            hf + "attn.c_proj.bias": sd[ours + "attention.dense.bias"],
            hf + "mlp.c_fc.weight": sd[ours + "mlp.fc1.weight"].t(),
            hf + "mlp.c_fc.bias": sd[ours + "mlp.fc1.bias"],
            hf + "mlp.c_proj.weight": sd[ours + "mlp.fc2.weight"].t(),
            hf + "mlp.c_proj.bias": sd[ours + "mlp.fc2.bias"]})
    return out


def _llama_mlp(sd: StateDict, ours: str, hf: str, x: str) -> StateDict:
    gate, up = sd[f"{ours}mlp.fc1.{x}"].chunk(2, dim=0)
    return {f"{hf}mlp.gate_proj.{x}": gate, f"{hf}mlp.up_proj.{x}": up,
            f"{hf}mlp.down_proj.{x}": sd[f"{ours}mlp.fc2.{x}"]}


# The hub's layout of each MoE architecture's experts: the prefix under a layer of its router
# (<prefix>gate) and experts (<prefix>experts.<e>.<name>), and the names of each expert's gate,
# up and down matrices. transformers 5 folds them into its stacked experts on load.
HUB_EXPERTS = {"mixtral": ("block_sparse_moe.", ("w1", "w3", "w2")),
               "qwen3_moe": ("mlp.", ("gate_proj", "up_proj", "down_proj"))}


def _hub_experts(sd: StateDict, ours: str, hf: str, x: str, kind: str) -> StateDict:
    """Our router [E, h] and stacked experts (fc1 [E, 2f, h] = per expert [gate; up], fc2
    [E, h, f]) -> the hub's names of `kind` (HUB_EXPERTS), one tensor per expert and matrix."""
    prefix, (gate_name, up_name, down_name) = HUB_EXPERTS[kind]
    moe = hf + prefix
    out = {f"{moe}gate.{x}": sd[f"{ours}mlp.router.{x}"]}
    for e, (fc1, fc2) in enumerate(zip(sd[f"{ours}mlp.experts.w1"], sd[f"{ours}mlp.experts.w2"])):
        gate, up = fc1.chunk(2, dim=0)
        out.update({f"{moe}experts.{e}.{gate_name}.{x}": gate,
                    f"{moe}experts.{e}.{up_name}.{x}": up,
                    f"{moe}experts.{e}.{down_name}.{x}": fc2})
    return out


def llama_state_dict(sd: StateDict, m, kind: str = "llama") -> StateDict:
    """Llama and Qwen; Mixtral and Qwen3-MoE (experts in place of the MLP of every layer)."""
    mlp = functools.partial(_hub_experts, kind=kind) if kind in HUB_EXPERTS else _llama_mlp
    out = {"model.embed_tokens.weight": sd["embedding.word_embeddings.weight"]}
    out.update(_norm_names(m, "llama", "final_norm.", "model.norm.", sd))
    if not m.tie_embeddings:
        out["lm_head.weight"] = sd["output.head.weight"]
    for i in range(m.num_layers):
        ours, hf = f"layers.{i}.", f"model.layers.{i}."
        out.update(_norm_names(m, "llama", ours + "norm1.", hf + "input_layernorm.", sd))
        out.update(_norm_names(m, "llama", ours + "norm2.", hf + "post_attention_layernorm.", sd))
        for x in ("weight", "bias") if m.qkv_bias else ("weight",):
            q, k, v = _qkv_parts(sd[f"{ours}attention.qkv.{x}"], m)
            out.update({f"{hf}self_attn.q_proj.{x}": q, f"{hf}self_attn.k_proj.{x}": k,
                        f"{hf}self_attn.v_proj.{x}": v})
        for x in ("weight", "bias") if m.add_bias_linear else ("weight",):
            out[f"{hf}self_attn.o_proj.{x}"] = sd[f"{ours}attention.dense.{x}"]
            out.update(mlp(sd, ours, hf, x))
        if m.attention.qk_norm:  # Qwen3's per-head norms
            for name in ("q_norm", "k_norm"):
                out.update(_norm_names(m, "llama", f"{ours}attention.{name}.",
                                       f"{hf}self_attn.{name}.", sd))
    return out


# Gemma's norms scale by 1 + weight (its RMSNorm stores the offset from 1); ours by the weight.
GEMMA_NORMS = {"input_layernorm.": "norm1.", "post_attention_layernorm.": "post_attention_norm.",
               "pre_feedforward_layernorm.": "norm2.",
               "post_feedforward_layernorm.": "post_mlp_norm.",
               "self_attn.q_norm.": "attention.q_norm.", "self_attn.k_norm.": "attention.k_norm."}


def gemma_norms(m) -> Dict[str, str]:
    """GEMMA_NORMS of a layer of `m`: Gemma 3's q and k norms only where it has them (Gemma 2
    has none)."""
    return {theirs: mine for theirs, mine in GEMMA_NORMS.items()
            if m.attention.qk_norm or "attention." not in mine}


def gemma3_state_dict(sd: StateDict, m) -> StateDict:
    """Gemma 3 (text): Llama's names for the projections and the MLP, Gemma's for its norms,
    each stored as weight - 1 (GEMMA_NORMS)."""

    def norm(ours: str, theirs: str) -> StateDict:
        return {theirs + "weight": sd[ours + "weight"].float() - 1.0}
    out = {"model.embed_tokens.weight": sd["embedding.word_embeddings.weight"],
           **norm("final_norm.", "model.norm.")}
    if not m.tie_embeddings:
        out["lm_head.weight"] = sd["output.head.weight"]
    for i in range(m.num_layers):
        ours, hf = f"layers.{i}.", f"model.layers.{i}."
        for theirs, mine in gemma_norms(m).items():
            out.update(norm(ours + mine, hf + theirs))
        q, k, v = _qkv_parts(sd[f"{ours}attention.qkv.weight"], m)
        out.update({f"{hf}self_attn.q_proj.weight": q, f"{hf}self_attn.k_proj.weight": k,
                    f"{hf}self_attn.v_proj.weight": v,
                    f"{hf}self_attn.o_proj.weight": sd[f"{ours}attention.dense.weight"]})
        out.update(_llama_mlp(sd, ours, hf, "weight"))
    return out


def _query_scalar(m):
    """Gemma's query_pre_attn_scalar: the scores' scale is its inverse square root."""
    scale = m.attention.softmax_scale
    if scale is None:
        return m.head_dim
    scalar = round(scale ** -2, 6)
    return int(scalar) if scalar == int(scalar) else scalar


def _gemma3_config(m, common: dict) -> dict:
    """Gemma3TextConfig's fields: the global layers' rotary (with model.rope_scaling), the
    windowed layers' own base where model.attention.window_rotary_base sets one."""
    a = m.attention
    full = _rope_fields(m)["rope_parameters"]
    local = (full if a.window_rotary_base is None
             else {"rope_type": "default", "rope_theta": a.window_rotary_base})
    return dict(_gemma_config(m, common), architectures=["Gemma3ForCausalLM"],
                model_type="gemma3_text",
                rope_parameters={"full_attention": full, "sliding_attention": local})


def _gemma_config(m, common: dict) -> dict:
    """Gemma 2's and 3's shared fields: the shape, the scores' scale, the window, every layer's
    kind (layer_types: transformers 4.53 on; earlier Gemma 2 alternates them, as
    sliding_window_pattern 2 does) and the caps (null where there is none)."""
    a = m.attention
    types = ["sliding_attention" if a.window_of(i) is not None else "full_attention"
             for i in range(m.num_layers)]
    return dict(common, layer_types=types, hidden_size=m.hidden_size,
                intermediate_size=m.ffn_hidden_size, num_hidden_layers=m.num_layers,
                num_attention_heads=m.num_attention_heads, num_key_value_heads=m.kv_heads,
                head_dim=m.head_dim,
                query_pre_attn_scalar=_query_scalar(m),
                max_position_embeddings=m.max_position_embeddings, rms_norm_eps=m.norm_epsilon,
                hidden_activation="gelu_pytorch_tanh", attention_bias=False,
                attention_dropout=0.0, sliding_window=a.sliding_window or None,
                attn_logit_softcapping=a.logit_softcapping or None,
                final_logit_softcapping=m.output.logit_softcapping or None)


def _gemma2_config(m, common: dict) -> dict:
    """Gemma2Config's fields: one rotary (transformers 5's rope_parameters and 4's
    rope_theta)."""
    return dict(_gemma_config(m, common), architectures=["Gemma2ForCausalLM"],
                model_type="gemma2", rope_theta=m.rotary_base, **_rope_fields(m))


def _eod_id(tok):
    """The end-of-document id (what generation stops at), or None when the tokenizer has none."""
    try:
        return tok.eod
    except InputError:
        return None


def hf_config(merged: MergedCheckpoint, kind: str, dtype: str, eod) -> dict:
    m = merged.config.model
    common = {"vocab_size": merged.padded_vocab_size, "torch_dtype": str(DTYPES[dtype])[6:],
              "tie_word_embeddings": m.tie_embeddings, "use_cache": True,
              "bos_token_id": eod, "eos_token_id": eod}
    if kind == "gpt2":
        return dict(common, architectures=["GPT2LMHeadModel"], model_type="gpt2",
                    n_embd=m.hidden_size, n_layer=m.num_layers, n_head=m.num_attention_heads,
                    n_inner=m.ffn_hidden_size, n_positions=m.max_position_embeddings,
                    activation_function="gelu_new", layer_norm_epsilon=m.norm_epsilon,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                    scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
                    reorder_and_upcast_attn=False)
    if kind == "gemma3":
        return _gemma3_config(m, common)
    if kind == "gemma2":
        return _gemma2_config(m, common)
    llama = _llama_config(m, common)
    if kind == "llama":
        return llama
    if kind == "mistral":  # no bias settings: Mistral has none
        return dict({k: v for k, v in llama.items() if k not in ("attention_bias", "mlp_bias")},
                    architectures=["MistralForCausalLM"], model_type="mistral",
                    sliding_window=m.attention.sliding_window)
    if kind == "qwen3_moe":
        return dict(llama, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                    attention_bias=False, use_sliding_window=False, sliding_window=None,
                    moe_intermediate_size=moe.expert_ffn(m), num_experts=m.moe.num_experts,
                    num_experts_per_tok=m.moe.top_k, decoder_sparse_step=1, mlp_only_layers=[],
                    norm_topk_prob=m.moe.router == "softmax_renorm",
                    router_aux_loss_coef=m.moe.aux_loss_coeff, output_router_logits=False)
    if kind in ("qwen2", "qwen3"):
        # Qwen2's q, k and v always have biases and its o_proj none; Qwen3's attention_bias
        # covers all four (false here); neither has an MLP bias setting
        drop = {"mlp_bias"} | ({"attention_bias"} if kind == "qwen2" else set())
        qwen = {k: v for k, v in llama.items() if k not in drop}
        return dict(qwen, architectures=[f"{kind.capitalize()}ForCausalLM"], model_type=kind,
                    use_sliding_window=False, sliding_window=None,
                    max_window_layers=m.num_layers)
    return dict(llama, architectures=["MixtralForCausalLM"], model_type="mixtral",
                intermediate_size=moe.expert_ffn(m), num_local_experts=m.moe.num_experts,
                num_experts_per_tok=m.moe.top_k, router_aux_loss_coef=m.moe.aux_loss_coeff,
                output_router_logits=False, router_jitter_noise=0.0,
                sliding_window=m.attention.sliding_window or None)


def _llama_config(m, common: dict) -> dict:
    return dict(common, architectures=["LlamaForCausalLM"], model_type="llama",
                hidden_size=m.hidden_size, intermediate_size=m.ffn_hidden_size,
                num_hidden_layers=m.num_layers, num_attention_heads=m.num_attention_heads,
                num_key_value_heads=m.kv_heads, head_dim=m.head_dim,
                max_position_embeddings=m.max_position_embeddings, rms_norm_eps=m.norm_epsilon,
                rope_theta=m.rotary_base, **_rope_fields(m),
                hidden_act="silu", attention_bias=m.add_bias_linear,
                mlp_bias=m.add_bias_linear, attention_dropout=0.0)


def _rope_fields(m) -> dict:
    """rope_parameters (transformers 5) and, when scaled, rope_scaling (transformers 4)."""
    r = m.rope_scaling
    scaling = {}
    if r.type != "none":
        scaling = {"rope_type": r.type, "factor": r.factor}
        if r.type == "llama3":
            scaling.update(low_freq_factor=r.low_freq_factor, high_freq_factor=r.high_freq_factor,
                           original_max_position_embeddings=r.original_max_position_embeddings)
    out = {"rope_parameters": {"rope_type": "default", **scaling, "rope_theta": m.rotary_base}}
    return dict(out, rope_scaling=scaling) if scaling else out


def _tokenizer_files(cfg) -> List[str]:
    d = cfg.data
    names = {"gpt2": [d.vocab_file, d.merges_file], "huggingface": [d.tokenizer_model],
             "sentencepiece": [d.tokenizer_model]}.get(d.tokenizer_type, [])
    return [p for p in names if p]


def check_output_dir(output_dir: str) -> None:
    """--output-dir: a new or empty folder (checked before the run's shards are merged)."""
    check_output("--output-dir", output_dir, "dir")
    if os.path.isdir(output_dir) and os.listdir(output_dir):
        raise InputError(f"--output-dir: {output_dir!r} is not empty: expected a new or empty "
                         f"folder for config.json, model.safetensors and the tokenizer; choose "
                         f"a new one")


def check_exportable(cfg):
    """What the export needs from the run's config alone, checked before the shards are merged
    (minutes on a large model): an architecture the model maps to exactly, and the tokenizer
    files it names, loaded. Returns (the architecture, the tokenizer)."""
    kind = flavour(cfg.model)
    missing = [p for p in _tokenizer_files(cfg) if not os.path.isfile(p)]
    if missing:
        raise InputError(f"tokenizer file(s) {', '.join(missing)} named in the run's config do "
                         f"not exist here; run the export where the run's data config resolves")
    from megatron.data.tokenizers import build_tokenizer, spec_from_config
    return kind, build_tokenizer(spec_from_config(cfg))


def export_hf(merged: MergedCheckpoint, output_dir: str, dtype: str = "fp32") -> List[str]:
    """Writes output_dir/config.json, model.safetensors and the tokenizer files; returns the
    names written. The folder must not exist or be empty."""
    if dtype not in DTYPES:
        raise InputError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    check_output_dir(output_dir)
    kind, tok = check_exportable(merged.config)
    if kind == "gpt2":
        converted = gpt2_state_dict(merged.state_dict, merged.config.model)
    elif kind in ("gemma2", "gemma3"):
        converted = gemma3_state_dict(merged.state_dict, merged.config.model)
    else:
        converted = llama_state_dict(merged.state_dict, merged.config.model, kind)
    tensors = {k: v.to(DTYPES[dtype]).contiguous() for k, v in converted.items()}
    # written whole or not at all: into a sibling folder renamed into place at the end, so a
    # failed export (a full disk) leaves no half folder that the next try calls "not empty"
    final = os.path.normpath(output_dir)
    output_dir = f"{final}.tmp-{os.getpid()}"
    store.remove_quietly(output_dir)
    os.makedirs(output_dir)
    try:
        written = _write_folder(merged, output_dir, tensors, kind, dtype, tok)
        if os.path.isdir(final):
            shutil.copymode(final, output_dir)  # the folder the user made keeps its mode
            os.rmdir(final)  # empty (checked above); a file put there since fails here
        os.replace(output_dir, final)
    except BaseException:
        store.remove_quietly(output_dir)
        raise
    return written


def _write_folder(merged: MergedCheckpoint, output_dir: str, tensors, kind: str, dtype: str,
                  tok) -> List[str]:
    from safetensors.torch import save_file
    save_file(tensors, os.path.join(output_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(output_dir, "config.json"), "w") as f:
        json.dump(hf_config(merged, kind, dtype, _eod_id(tok)), f, indent=1, sort_keys=True)
    written = ["config.json", "model.safetensors"]
    kind_of_tokenizer = merged.config.data.tokenizer_type
    for path in _tokenizer_files(merged.config):
        name = {"sentencepiece": "tokenizer.model", "huggingface": "tokenizer.json"}.get(
            kind_of_tokenizer, os.path.basename(path))
        shutil.copyfile(path, os.path.join(output_dir, name))
        written.append(name)
    if kind_of_tokenizer in TOKENIZER_CLASSES:
        with open(os.path.join(output_dir, "tokenizer_config.json"), "w") as f:
            json.dump(tokenizer_config(merged, tok), f, indent=1, sort_keys=True)
        written.append("tokenizer_config.json")
    return written


# transformers' class for each tokenizer type; training never adds BOS/EOS around a document
# (only the end-of-document id between documents), so neither does the exported tokenizer.
TOKENIZER_CLASSES = {"gpt2": "GPT2Tokenizer", "huggingface": "PreTrainedTokenizerFast",
                     "sentencepiece": "LlamaTokenizer"}


def tokenizer_config(merged: MergedCheckpoint, tok) -> dict:
    eod = _eod_id(tok)
    eod_text = None
    if eod is not None:  # SentencePiece decodes control pieces to "": ask for the piece itself
        sp = getattr(tok, "_sp", None)
        eod_text = sp.id_to_piece(eod) if sp is not None else tok.detokenize([eod])
    out = {"tokenizer_class": TOKENIZER_CLASSES[merged.config.data.tokenizer_type],
           "add_bos_token": False, "add_eos_token": False, "model_max_length":
               merged.config.model.seq_length, "clean_up_tokenization_spaces": False}
    if eod_text:
        out["eos_token"] = eod_text
    if merged.config.data.tokenizer_type == "sentencepiece":
        out["legacy"] = False
    return out
