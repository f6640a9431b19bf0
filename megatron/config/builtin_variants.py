"""The built-in model variants (config/variants.py): their facts, torch-free, and where their
modules live. Registration order is the order `auto` tries attention cores in."""
from __future__ import annotations

from megatron.config.variants import Variant, Weight, register


def _hidden(m):
    return (m.hidden_size,)


# --- norms (model.normalization): statistics in fp32, over the hidden size; replicated over TP
register(Variant("norm", "layernorm", "megatron.model.norm:LayerNorm",
                 weights=(Weight("weight", _hidden), Weight("bias", _hidden)),
                 hf={"gpt2": {"weight": "weight", "bias": "bias"}}))
register(Variant("norm", "rmsnorm", "megatron.model.norm:RMSNorm",
                 weights=(Weight("weight", _hidden),),
                 hf={"llama": {"weight": "weight"}, "gemma3": {"weight": "weight"}}))

# --- activations (model.activation): fc1 -> act -> fc2
register(Variant("activation", "gelu", "megatron.model.mlp:bias_gelu", fc1_factor=1,
                 default_ffn=lambda h: 4 * h, hf={"gpt2": {}}))
# SwiGLU: fc1 = [gate; up]; 8h/3 rounded up to a multiple of 64 has the FLOPs of a 4h GeLU MLP
register(Variant("activation", "swiglu", "megatron.model.mlp:bias_swiglu", fc1_factor=2,
                 default_ffn=lambda h: ((8 * h // 3) + 63) // 64 * 64, hf={"llama": {}}))
# GeGLU: fc1 = [gate; up] -> gelu(gate) * up, the tanh GeLU (Gemma's gelu_pytorch_tanh)
register(Variant("activation", "geglu", "megatron.model.mlp:bias_geglu", fc1_factor=2,
                 default_ffn=lambda h: ((8 * h // 3) + 63) // 64 * 64, hf={"gemma3": {}}))

# --- positions (model.position_embedding_type)
register(Variant("position", "learned", None,
                 weights=(Weight("position_embeddings",
                                 lambda m: (m.max_position_embeddings, m.hidden_size)),),
                 hf={"gpt2": {"position_embeddings": "wpe.weight"}}))
register(Variant("position", "rotary", "megatron.model.rotary:for_model", rotates_qk=True,
                 hf={"llama": {}, "gemma3": {}}))

# --- attention cores (model.attention_backend): q, k, v of this rank's heads -> context
_SAME_FUNCTION = {"gpt2": {}, "llama": {}, "gemma3": {}}
register(Variant("attention", "flash", "megatron.model.attention_cores:FlashCore",
                 available="megatron.model.attention_cores:flash_available",
                 needs="flash-attn needs a GPU, bf16/fp16 and the flash_attn package",
                 sliding_window=True, softcapping=True, hf=_SAME_FUNCTION))
register(Variant("attention", "sdpa", "megatron.model.attention_cores:SdpaCore",
                 documents=True, sliding_window=True, hf=_SAME_FUNCTION))
register(Variant("attention", "math", "megatron.model.attention_cores:MathCore",
                 keeps_scores=True, documents=True, sliding_window=True, softcapping=True,
                 hf=_SAME_FUNCTION))
