"""Hugging Face peer: transformers' GPT2LMHeadModel with SDPA attention, built from a config of
the same shape (no dropout, tanh-GeLU, tied embeddings, no KV cache), its own loss
(labels=tokens: the model shifts them itself)."""
from __future__ import annotations

import torch

import facts


def build(shape: facts.Shape):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=shape.vocab, n_positions=shape.seq, n_embd=shape.hidden,
                        n_layer=shape.layers, n_head=shape.heads, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new",
                        initializer_range=facts.INIT_STD, tie_word_embeddings=True,
                        use_cache=False, bos_token_id=0, eos_token_id=0)
    config._attn_implementation = "sdpa"
    model = GPT2LMHeadModel(config)
    model.train()
    if model.config._attn_implementation != "sdpa":
        raise RuntimeError(f"GPT2LMHeadModel chose {model.config._attn_implementation} attention")

    def loss_fn(m, tokens, labels):
        return m(input_ids=tokens, labels=tokens, use_cache=False).loss

    return model, loss_fn
