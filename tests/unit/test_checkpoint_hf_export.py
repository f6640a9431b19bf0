"""Hugging Face export against transformers itself: every flavour (GPT-2; Llama with grouped
keys/values, tied and untied, with and without biases, heads of another width; Qwen2 with q, k
and v biases; Qwen3 with per-head q and k norms; Gemma 3's layer; Mixtral from a briefly
trained MoE model)
gives the same logits as our unsharded model, in fp32, for a random batch; and configs that map
to no architecture are refused."""
import os

import pytest
import torch

from megatron.config import load_config
from megatron.config.errors import InputError
from megatron.model import build_model
from megatron.parallel.state import ParallelState
from megatron.checkpoint.convert import MergedCheckpoint
from megatron.checkpoint.hf_export import export_hf
from tests.support.moe import trained_moe

transformers = pytest.importorskip("transformers", reason="pip install transformers (in .[dev])")

TINY = "examples/local/tiny.yaml"
LLAMA = ["model.position_embedding_type=rotary", "model.normalization=rmsnorm",
         "model.activation=swiglu", "model.add_bias_linear=false", "model.rotary_base=500000"]
CASES = {
    "gpt2": [],
    "llama_gqa_untied": LLAMA + ["model.num_query_groups=2", "model.tie_embeddings=false"],
    "llama_tied_bias": LLAMA[:-2] + ["model.add_bias_linear=true"],
    # heads 24 wide where hidden / heads is 16 (Llama's and Qwen3's head_dim)
    "llama_kv_channels": LLAMA + ["model.num_query_groups=2", "model.attention.kv_channels=24"],
    "qwen2": LLAMA + ["model.num_query_groups=2", "model.attention.add_qkv_bias=true"],
    # Llama 3.1's scaled frequencies (an original context of 16 under the 64 here, so the
    # blend covers some of the 8 frequency pairs), and position interpolation
    "llama_rope_llama3": LLAMA + ["model.rope_scaling.type=llama3", "model.rope_scaling.factor=8",
                                  "model.rope_scaling.original_max_position_embeddings=16"],
    "llama_rope_linear": LLAMA + ["model.rope_scaling.type=linear",
                                  "model.rope_scaling.factor=4"],
    "qwen3": LLAMA + ["model.num_query_groups=2", "model.attention.kv_channels=24",
                      "model.attention.qk_norm=true",
                      "model.tie_embeddings=false"],
    # Mistral 7B v0.1's sliding window in small: 8 keys of the 64 a query could see
    "mistral_window": LLAMA + ["model.num_query_groups=2", "model.attention.sliding_window=8"],
    # Gemma 3's layer: GeGLU, head norms, norms after the sub-blocks, the embedding times
    # sqrt(64), every other layer in a window of 8 with its own rotary base, the global ones'
    # scaled, and the scores scaled by 0.2 (query_pre_attn_scalar 25)
    "gemma3": LLAMA + ["model.num_query_groups=2", "model.activation=geglu",
                       "model.attention.qk_norm=true", "model.residual.post_norms=true",
                       "model.residual.embedding_multiplier=8.0",
                       "model.attention.sliding_window=8",
                       "model.attention.sliding_window_pattern=2",
                       "model.attention.window_rotary_base=100.0",
                       "model.rope_scaling.type=linear", "model.rope_scaling.factor=4",
                       "model.attention.softmax_scale=0.2"],
}
ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "mistral_window": "MistralForCausalLM",
                 "gemma3": "Gemma3ForCausalLM"}


def merged_model(overrides, root):
    cfg = load_config(f"{root}/{TINY}", ["model.vocab_size=500", "model.norm_epsilon=1e-6"]
                      + overrides)
    torch.manual_seed(0)
    model = build_model(cfg, ParallelState.single(), 512, torch.device("cpu")).eval()
    with torch.no_grad():  # norms and biases away from their 1/0 start, so a swap would show
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    return model, MergedCheckpoint(cfg, sd, 500, 512, {})


@pytest.mark.parametrize("case", sorted(CASES))
def test_transformers_reproduces_our_logits(case, tmp_path, root):
    model, merged = merged_model(CASES[case], root)
    written = export_hf(merged, str(tmp_path / case))
    assert written == ["config.json", "model.safetensors"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / case),
                                                           dtype=torch.float32).eval()
    expected = ARCHITECTURES.get(case, "LlamaForCausalLM")
    assert type(hf).__name__ == expected
    tokens = torch.randint(0, 500, (2, 64))
    with torch.no_grad():
        ours = model(tokens).transpose(0, 1)  # [s, b, V] -> [b, s, V]
        theirs = hf(tokens).logits
    assert theirs.shape == ours.shape == (2, 64, 512)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)


MIXTRAL = LLAMA + ["model.num_query_groups=2", "model.tie_embeddings=false",
                   "model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.router=softmax_renorm",
                   "model.moe.ffn_hidden_size=96"]


def test_mixtral_reproduces_our_moe_logits(tmp_path, root):
    model, merged = trained_moe(merged_model(MIXTRAL, root))
    export_hf(merged, str(tmp_path / "mixtral"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "mixtral"),
                                                           dtype=torch.float32).eval()
    assert type(hf).__name__ == "MixtralForCausalLM"
    tokens = torch.randint(0, 500, (2, 64))
    with torch.no_grad():
        ours = model(tokens).transpose(0, 1)
        theirs = hf(tokens).logits
    diff = float((theirs - ours).abs().max())
    print(f"Mixtral export: max logit difference {diff:.3g}")
    assert diff < 1e-5, diff


QWEN3_MOE = LLAMA + ["model.num_query_groups=2", "model.tie_embeddings=false",
                     "model.attention.kv_channels=24", "model.attention.qk_norm=true",
                     "model.moe.num_experts=4", "model.moe.top_k=2",
                     "model.moe.ffn_hidden_size=96"]


@pytest.mark.parametrize("router", ["softmax", "softmax_renorm"])
def test_qwen3_moe_reproduces_our_moe_logits(router, tmp_path, root):
    """Qwen3's attention with experts in every layer, its router plain or renormalised over the
    chosen experts (norm_topk_prob), from a briefly trained model."""
    model, merged = trained_moe(merged_model(QWEN3_MOE + [f"model.moe.router={router}"], root))
    export_hf(merged, str(tmp_path / "q"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "q"),
                                                           dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen3MoeForCausalLM"
    assert hf.config.norm_topk_prob == (router == "softmax_renorm")
    tokens = torch.randint(0, 500, (2, 64))
    with torch.no_grad():
        diff = float((hf(tokens).logits - model(tokens).transpose(0, 1)).abs().max())
    print(f"Qwen3-MoE export ({router}): max logit difference {diff:.3g}")
    assert diff < 1e-5, diff


def test_experts_map_only_to_mixtral_with_its_router_and_every_layer_moe(tmp_path, root):
    for extra, why in ((["model.moe.router=softmax"], "moe.router='softmax' (needs "
                        "'softmax_renorm')"),
                       (["model.moe.layer_freq=2"], "moe.layer_freq=2 (needs 1)")):
        _, merged = merged_model(MIXTRAL + extra, root)
        with pytest.raises(InputError, match="maps to no Hugging Face architecture") as e:
            export_hf(merged, str(tmp_path / "x"))
        assert why in str(e.value) and "num_experts=4 (needs 0" in str(e.value)


def test_unmappable_configs_are_refused_with_the_fields(tmp_path, root):
    _, merged = merged_model(["model.normalization=rmsnorm"], root)
    with pytest.raises(InputError, match="maps to no Hugging Face architecture") as e:
        export_hf(merged, str(tmp_path / "x"))
    assert "model.normalization='rmsnorm' declares no GPT-2 names" in str(e.value)
    _, merged = merged_model(["model.num_query_groups=2"], root)
    with pytest.raises(InputError, match="num_query_groups=2 of 4 heads"):
        export_hf(merged, str(tmp_path / "y"))
    # what no architecture holds is refused, never dropped: GPT-2 with other head widths or
    # head norms; q, k and v biases with the others' (Llama's attention_bias covers o too)
    for extra, why in ((["model.attention.kv_channels=8"], "kv_channels=8 (needs None)"),
                       (["model.attention.qk_norm=true"], "qk_norm=True (needs False)"),
                       (LLAMA + ["model.attention.add_qkv_bias=true",
                                 "model.attention.qk_norm=true"],
                        "add_qkv_bias=True (needs False)"),
                       # windows on some layers only (Gemma's pattern): Gemma 3 alone holds
                       # them, with its other settings
                       (LLAMA + ["model.attention.sliding_window=8",
                                 "model.attention.sliding_window_pattern=2"],
                        "for Mistral, attention.sliding_window_pattern=2 (needs 0)"),
                       # norms after the sub-blocks, a scaled embedding, a windowed layer's own
                       # rotary base: never dropped by an architecture without them
                       (LLAMA + ["model.residual.post_norms=true"],
                        "for Llama, residual.post_norms=True (needs False)"),
                       (LLAMA + ["model.residual.embedding_multiplier=2.0"],
                        "for Llama, residual.embedding_multiplier=2.0 (needs 1.0)"),
                       (LLAMA + ["model.attention.softmax_scale=0.2"],
                        "for Llama, attention.softmax_scale=0.2 (needs None)"),
                       (LLAMA + ["model.attention.sliding_window=8",
                                 "model.attention.window_rotary_base=100.0"],
                        "for Mistral, attention.window_rotary_base=100.0 (needs None)"),
                       (LLAMA + ["model.activation=geglu", "model.attention.qk_norm=true",
                                 "model.residual.post_norms=true",
                                 "model.residual.embedding_multiplier=2.0"],
                        "for Gemma 3, residual.embedding_multiplier=2.0 (needs sqrt(hidden_size)"
                        " = 8.0)")):
        _, merged = merged_model(extra, root)
        with pytest.raises(InputError, match="maps to no Hugging Face architecture") as e:
            export_hf(merged, str(tmp_path / "z"))
        assert why in str(e.value), str(e.value)
    _, merged = merged_model([], root)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    with pytest.raises(InputError, match="is not empty"):
        export_hf(merged, str(tmp_path / "full"))


def test_sentencepiece_tokenizer_is_exported_and_encodes_like_ours(tmp_path, root):
    """The run's SentencePiece model goes beside the weights with a tokenizer_config.json; the
    tokenizer transformers builds from it gives our ids (no BOS/EOS added, as in training).
    Known difference: a text that starts with a space gets one leading '▁' piece fewer from
    transformers, so only texts that do not start with one are compared."""
    from megatron.data.tokenizers.sentencepiece import SentencePieceTokenizer
    from megatron.data.tokenizers.train import train_sentencepiece
    corpus = tmp_path / "c.txt"
    corpus.write_text(("ROMEO:\nBut, soft! what light through yonder window breaks?\n"
                       "  Arise, fair sun,\tand kill the envious moon.\n") * 40
                      + "Ünïcödé ☃ 1234 —  double  spaces\n\n")
    sp_path = train_sentencepiece([str(corpus)], str(tmp_path / "sp"), 400)
    _, merged = merged_model(LLAMA + ["data.tokenizer_type=sentencepiece",
                                      f"data.tokenizer_model={sp_path}", "model.vocab_size=400"],
                             root)
    written = export_hf(merged, str(tmp_path / "hf"))
    assert written == ["config.json", "model.safetensors", "tokenizer.model",
                       "tokenizer_config.json"]
    ours = SentencePieceTokenizer(sp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert theirs.eos_token_id == ours.eod
    for text in ("ROMEO:\nBut, soft!", "x\n  Arise, fair sun", "Question: who? Answer: Paris",
                 "Ünïcödé ☃ 1234 —  double  spaces\n\n", "It is the east,\tand Juliet"):
        assert theirs.encode(text, add_special_tokens=False) == ours.tokenize(text), text


@pytest.mark.parametrize("kind", ["gpt2", "huggingface"])
def test_bpe_tokenizers_are_exported_and_encode_like_ours(kind, tmp_path, root):
    """GPT-2 vocab.json + merges.txt, or a tokenizer.json, beside the weights: transformers'
    tokenizer from the folder gives our ids and our end-of-document id."""
    pytest.importorskip("tokenizers")
    from megatron.data.tokenizers import build_tokenizer, spec_from_config
    from tests.support.data import bytelevel_bpe, corpus_lines
    texts = corpus_lines(300, seed=5) + ["  two leading spaces", "tab\tand\nnewline", "Ünï ☃"]
    bytelevel_bpe(tmp_path, texts, vocab_size=500)
    files = ([f"data.vocab_file={tmp_path / 'vocab.json'}",
              f"data.merges_file={tmp_path / 'merges.txt'}"] if kind == "gpt2"
             else [f"data.tokenizer_model={tmp_path / 'tokenizer.json'}"])
    _, merged = merged_model([f"data.tokenizer_type={kind}"] + files, root)
    written = export_hf(merged, str(tmp_path / "hf"))
    assert "tokenizer_config.json" in written
    ours = build_tokenizer(spec_from_config(merged.config))
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert theirs.eos_token_id == ours.eod
    for text in texts[-3:] + corpus_lines(20, seed=6):
        assert theirs.encode(text, add_special_tokens=False) == ours.tokenize(text), text


def test_a_failed_export_leaves_no_folder_and_an_empty_one_is_filled(tmp_path, root,
                                                                      monkeypatch):
    """A write failing part way (here config.json, after model.safetensors) left a half folder
    that the next try refused as "not empty"; the folder now appears whole or not at all."""
    from megatron.checkpoint import hf_export
    _, merged = merged_model([], root)
    out = tmp_path / "hf"

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(hf_export, "hf_config", full)
    with pytest.raises(OSError):
        export_hf(merged, str(out))
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    out.mkdir()  # an empty folder is taken, and keeps the mode it was made with
    out.chmod(0o750)
    assert export_hf(merged, str(out)) == ["config.json", "model.safetensors"]
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    assert (out.stat().st_mode & 0o777) == 0o750
    assert os.listdir(tmp_path) == ["hf"]
