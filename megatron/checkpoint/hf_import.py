"""Hugging Face import: a transformers GPT-2, Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Mixtral,
Gemma 2 or Gemma 3 folder (of an image-text Gemma 3, its language model; the vision tower is
left out) (config.json + safetensors, single or sharded) as a single-file model
(convert.save_single),
from which `checkpoint.init_from` starts a run of any layout: continued pretraining of published
weights. The inverse of hf_export.py (Mistral's
weights are Llama's and export as Llama), weight for weight: the experts from the hub's
per-expert tensors (Mixtral's block_sparse_moe.experts.<e>.w1/w3/w2, Qwen3-MoE's
mlp.experts.<e>.gate_proj/up_proj/down_proj) or transformers 5's stacked
mlp.experts.gate_up_proj / down_proj; Qwen2's q, k and v biases as
model.attention.add_qkv_bias, Qwen3's q_norm and k_norm as model.attention.qk_norm, a head_dim
apart from hidden / heads as model.attention.kv_channels; Gemma 3's GeGLU, norms after the
attention and the MLP (model.residual), embedding scale, local and global layers
(model.attention.sliding_window_pattern, window_rotary_base) and query scale
(query_pre_attn_scalar^-0.5 as model.attention.softmax_scale), its norms' weights stored as
1 + weight; Gemma 2's the same without q and k norms, with its caps of the attention scores
and the logits (model.attention.logit_softcapping, model.output.logit_softcapping). Linear and
Llama 3.1's rope scaling become model.rope_scaling. Architectures or options this model does
not implement (other rope scalings, sliding windows, separate attention and MLP bias settings,
dense layers among Qwen3-MoE's experts) are refused with the field and its value
(config/hf_models.py)."""
from __future__ import annotations

import functools
import json
import os
from typing import Dict

import torch

from megatron.config import variants
from megatron.config.errors import InputError
from megatron.config.hf_models import hf_model_config, model_section, read_hf_config
from megatron.checkpoint.convert import MergedCheckpoint
from megatron.checkpoint.hf_export import HUB_EXPERTS, gemma_norms

StateDict = Dict[str, torch.Tensor]


def _read_weights(hf_dir: str) -> StateDict:
    from safetensors.torch import load_file
    single = os.path.join(hf_dir, "model.safetensors")
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    if os.path.isfile(single):
        return load_file(single)
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        out: StateDict = {}
        for name in files:
            out.update(load_file(os.path.join(hf_dir, name)))
        return out
    raise InputError(f"{hf_dir!r} holds neither model.safetensors nor model.safetensors.index.json"
                     f"; save the model with safetensors (save_pretrained does by default)")


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m) -> torch.Tensor:
    """[q heads; k heads; v heads] -> our rows: per key/value group, its query heads, its key,
    its value."""
    groups, d = m.kv_heads, m.head_dim
    g = m.num_attention_heads // groups
    rest = q.shape[1:]
    parts = [q.reshape(groups, g * d, *rest), k.reshape(groups, d, *rest),
             v.reshape(groups, d, *rest)]
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def _need(sd: StateDict, name: str, hf_dir: str) -> torch.Tensor:
    if name not in sd:
        raise InputError(f"{hf_dir!r}: weight {name!r} is missing from the safetensors files")
    return sd[name]


def _norm_from(m, arch: str, theirs: str, ours: str, w) -> StateDict:
    """The norm at `theirs` under its record's names for `arch` (config/variants.py)."""
    return {ours + mine: w(theirs + hf) for mine, hf in variants.of(m, "norm").hf[arch].items()}


def _from_gpt2(sd: StateDict, m, hf_dir: str) -> StateDict:
    def w(name):
        return _need(sd, name, hf_dir)
    out = {"embedding.word_embeddings.weight": w("transformer.wte.weight")}
    positions = variants.of(m, "position").hf["gpt2"]
    out.update({"embedding." + mine: w("transformer." + hf) for mine, hf in positions.items()})
    out.update(_norm_from(m, "gpt2", "transformer.ln_f.", "final_norm.", w))
    h = m.hidden_size
    for i in range(m.num_layers):
        hf, ours = f"transformer.h.{i}.", f"layers.{i}."
        qkv_w = w(hf + "attn.c_attn.weight").t()  # Conv1D [in, out] -> [out, in]
        qkv_b = w(hf + "attn.c_attn.bias")
        out.update(_norm_from(m, "gpt2", hf + "ln_1.", ours + "norm1.", w))
        out.update(_norm_from(m, "gpt2", hf + "ln_2.", ours + "norm2.", w))
        out.update({
            ours + "attention.qkv.weight": _fuse_qkv(*qkv_w.split(h), m),
            ours + "attention.qkv.bias": _fuse_qkv(*qkv_b.split(h), m),
            ours + "attention.dense.weight": w(hf + "attn.c_proj.weight").t(),
            ours + "attention.dense.bias": w(hf + "attn.c_proj.bias"),
            ours + "mlp.fc1.weight": w(hf + "mlp.c_fc.weight").t(),
            ours + "mlp.fc1.bias": w(hf + "mlp.c_fc.bias"),
            ours + "mlp.fc2.weight": w(hf + "mlp.c_proj.weight").t(),
            ours + "mlp.fc2.bias": w(hf + "mlp.c_proj.bias")})
    return out


def _llama_mlp(w, m, hf: str, ours: str, x: str) -> StateDict:
    mlp = hf + "mlp."
    return {ours + f"mlp.fc1.{x}": torch.cat([w(f"{mlp}gate_proj.{x}"), w(f"{mlp}up_proj.{x}")]),
            ours + f"mlp.fc2.{x}": w(f"{mlp}down_proj.{x}")}


def _hub_experts(w, m, hf: str, ours: str, x: str, kind: str) -> StateDict:
    """The router and the experts stacked [E, ...], fc1 per expert [gate; up]: from
    transformers 5's own stacked layout (mlp.gate, mlp.experts.gate_up_proj / down_proj), else
    from the hub's per-expert tensors of `kind` (hf_export.HUB_EXPERTS)."""
    if w.has(hf + "mlp.experts.gate_up_proj"):
        return {ours + "mlp.router.weight": w(hf + "mlp.gate.weight"),
                ours + "mlp.experts.w1": w(hf + "mlp.experts.gate_up_proj"),
                ours + "mlp.experts.w2": w(hf + "mlp.experts.down_proj")}
    prefix, (gate, up, down) = HUB_EXPERTS[kind]
    experts = [f"{hf}{prefix}experts.{e}." for e in range(m.moe.num_experts)]
    return {ours + "mlp.router.weight": w(f"{hf}{prefix}gate.weight"),
            ours + "mlp.experts.w1": torch.stack([torch.cat([w(f"{p}{gate}.weight"),
                                                             w(f"{p}{up}.weight")])
                                                  for p in experts]),
            ours + "mlp.experts.w2": torch.stack([w(f"{p}{down}.weight") for p in experts])}


class _Weights:
    """The folder's tensors by name; a missing one is an InputError naming it."""

    def __init__(self, sd: StateDict, hf_dir: str):
        self.sd, self.hf_dir = sd, hf_dir

    def __call__(self, name: str) -> torch.Tensor:
        return _need(self.sd, name, self.hf_dir)

    def has(self, name: str) -> bool:
        return name in self.sd


def _from_llama(sd: StateDict, m, hf_dir: str, kind: str = "llama") -> StateDict:
    """Llama and Qwen; Mixtral and Qwen3-MoE (experts in place of every layer's MLP)."""
    w = _Weights(sd, hf_dir)
    mlp = functools.partial(_hub_experts, kind=kind) if kind in HUB_EXPERTS else _llama_mlp
    out = {"embedding.word_embeddings.weight": w("model.embed_tokens.weight")}
    out.update(_norm_from(m, "llama", "model.norm.", "final_norm.", w))
    if not m.tie_embeddings:
        out["output.head.weight"] = w("lm_head.weight")
    for i in range(m.num_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        attn = hf + "self_attn."
        out.update(_norm_from(m, "llama", hf + "input_layernorm.", ours + "norm1.", w))
        out.update(_norm_from(m, "llama", hf + "post_attention_layernorm.", ours + "norm2.", w))
        for x in ("weight", "bias") if m.qkv_bias else ("weight",):
            out[ours + f"attention.qkv.{x}"] = _fuse_qkv(w(f"{attn}q_proj.{x}"),
                                                         w(f"{attn}k_proj.{x}"),
                                                         w(f"{attn}v_proj.{x}"), m)
        for x in ("weight", "bias") if m.add_bias_linear else ("weight",):
            out[ours + f"attention.dense.{x}"] = w(f"{attn}o_proj.{x}")
            out.update(mlp(w, m, hf, ours, x))
        if m.attention.qk_norm:  # Qwen3's per-head norms
            for name in ("q_norm", "k_norm"):
                out.update(_norm_from(m, "llama", f"{attn}{name}.", f"{ours}attention.{name}.", w))
    return out


# Where a Gemma 3 folder keeps its text model: the text-only models at the top, the image-text
# ones (Gemma3ForConditionalGeneration) under language_model in the hub's layout, or
# transformers 5's own; each with the prefix of its untied lm_head.
GEMMA3_PREFIXES = (("model.", ""), ("language_model.model.", "language_model."),
                   ("model.language_model.", ""))


def _from_gemma3(sd: StateDict, m, hf_dir: str) -> StateDict:
    """Gemma 3 (text; an image-text model's language model, its vision tower left out) and
    Gemma 2 (no q and k norms): Llama's projections and MLP; every norm's weight + 1, in
    fp32."""
    w = _Weights(sd, hf_dir)
    prefix, head = next(((p, h) for p, h in GEMMA3_PREFIXES if w.has(p + "embed_tokens.weight")),
                        GEMMA3_PREFIXES[0])

    def norm(theirs: str, ours: str) -> StateDict:
        return {ours + "weight": w(theirs + "weight").float() + 1.0}
    out = {"embedding.word_embeddings.weight": w(prefix + "embed_tokens.weight"),
           **norm(prefix + "norm.", "final_norm.")}
    if not m.tie_embeddings:
        out["output.head.weight"] = w(head + "lm_head.weight")
    for i in range(m.num_layers):
        hf, ours = f"{prefix}layers.{i}.", f"layers.{i}."
        attn = hf + "self_attn."
        for theirs, mine in gemma_norms(m).items():
            out.update(norm(hf + theirs, ours + mine))
        out[ours + "attention.qkv.weight"] = _fuse_qkv(w(f"{attn}q_proj.weight"),
                                                       w(f"{attn}k_proj.weight"),
                                                       w(f"{attn}v_proj.weight"), m)
        out[ours + "attention.dense.weight"] = w(f"{attn}o_proj.weight")
        out.update(_llama_mlp(w, m, hf, ours, "weight"))
    return out


def import_hf(hf_dir: str) -> MergedCheckpoint:
    """The folder's model as a MergedCheckpoint (TP = PP = 1 names, the folder's dtype, no
    vocabulary padding: the run pads as its own TP size requires)."""
    hf = read_hf_config(hf_dir)
    cfg = hf_model_config(hf, os.path.join(hf_dir, "config.json"))
    sd = _read_weights(hf_dir)
    kind = hf["model_type"]
    if kind == "gpt2":
        converted = _from_gpt2(sd, cfg.model, hf_dir)
    elif kind in ("gemma3_text", "gemma3", "gemma2"):
        converted = _from_gemma3(sd, cfg.model, hf_dir)
    else:
        converted = _from_llama(sd, cfg.model, hf_dir, kind)
    state = {k: v.contiguous() for k, v in converted.items()}
    vocab = cfg.model.vocab_size
    return MergedCheckpoint(cfg, state, vocab, vocab,
                            {"hf_dir": os.path.abspath(hf_dir), "step": None,
                             "tensor_parallel_size": 1, "pipeline_parallel_size": 1})


__all__ = ["import_hf", "model_section"]
