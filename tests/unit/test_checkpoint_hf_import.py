"""Hugging Face import: a model transformers itself built and saved (GPT-2; Llama with grouped
keys/values, tied or not, with biases, with a head_dim of its own; Mistral with and without a
sliding window; Qwen2; Qwen3; Mixtral; Gemma 3 with its global layers' rotary scaled; Gemma 2
with its scores and logits capped)
becomes a single file whose unsharded model gives transformers' logits; export then import
gives back our exact tensors; unsupported options are refused with the field. Training from
the file in another layout is covered by init_from's end-to-end test
(tests/e2e/test_checkpoint_layout_change.py)."""
import json

import pytest
import torch

from megatron.cli.convert import main as convert_main
from megatron.config.errors import InputError
from megatron.checkpoint.convert import build_single_model, load_single
from megatron.checkpoint.hf_export import export_hf
from megatron.checkpoint.hf_import import import_hf
from tests.support.moe import trained_moe

transformers = pytest.importorskip("transformers", reason="pip install transformers (in .[dev])")

SMALL = dict(vocab_size=300, hidden_size=64, num_attention_heads=4, max_position_embeddings=64)
CONFIGS = {
    "gpt2": lambda: transformers.GPT2Config(vocab_size=300, n_embd=64, n_layer=2, n_head=4,
                                            n_positions=64, resid_pdrop=0, embd_pdrop=0,
                                            attn_pdrop=0),
    "llama_gqa": lambda: transformers.LlamaConfig(**SMALL, intermediate_size=160,
                                                  num_hidden_layers=2, num_key_value_heads=2,
                                                  rope_theta=1e4, tie_word_embeddings=False),
    "llama_tied_bias": lambda: transformers.LlamaConfig(**SMALL, intermediate_size=128,
                                                        num_hidden_layers=2,
                                                        tie_word_embeddings=True,
                                                        attention_bias=True, mlp_bias=True),
    # q, k and v with biases; Qwen3 0.6B's shape in small: heads wider than hidden / heads
    "qwen2": lambda: transformers.Qwen2Config(**SMALL, intermediate_size=160,
                                              num_hidden_layers=2, num_key_value_heads=2,
                                              tie_word_embeddings=True),
    "qwen3": lambda: transformers.Qwen3Config(**SMALL, intermediate_size=160, head_dim=32,
                                              num_hidden_layers=2, num_key_value_heads=2,
                                              tie_word_embeddings=False),
    "llama_head_dim": lambda: transformers.LlamaConfig(**SMALL, intermediate_size=160,
                                                       head_dim=8, num_hidden_layers=2),
    # Mistral NeMo's shape in small: heads of 32 over hidden / heads = 16, no sliding window
    "mistral": lambda: transformers.MistralConfig(**SMALL, intermediate_size=160, head_dim=32,
                                                  num_hidden_layers=2, num_key_value_heads=2,
                                                  sliding_window=None),
    "llama31_rope": lambda: transformers.LlamaConfig(
        **SMALL, intermediate_size=160, num_hidden_layers=2, num_key_value_heads=2,
        rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 16}),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**SMALL, intermediate_size=160,
                                                     moe_intermediate_size=48, head_dim=32,
                                                     num_experts=4, num_experts_per_tok=2,
                                                     norm_topk_prob=True, num_hidden_layers=2,
                                                     num_key_value_heads=2),
    # Mistral 7B v0.1's sliding window in small: 8 keys of the 40 a query could see
    "mistral_window": lambda: transformers.MistralConfig(**SMALL, intermediate_size=160,
                                                         num_hidden_layers=2,
                                                         num_key_value_heads=2, sliding_window=8),
    # Gemma 3 1B's shape in small: heads of 32 over hidden / heads = 16, every 2nd layer global
    # (1B: every 6th), a window of 8 keys with its own rotary base, the global layers' scaled
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **SMALL, intermediate_size=160, num_hidden_layers=2, num_key_value_heads=2, head_dim=32,
        query_pre_attn_scalar=32, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                         "full_attention": {"rope_type": "linear", "factor": 4.0,
                                            "rope_theta": 1e6}}),
    # Gemma 3 27B's query scale in small: query_pre_attn_scalar 24 with heads of 32 (27B: 168
    # with heads of 128), one window rotary base for every layer
    "gemma3_scaled": lambda: transformers.Gemma3TextConfig(
        **SMALL, intermediate_size=160, num_hidden_layers=2, num_key_value_heads=2, head_dim=32,
        query_pre_attn_scalar=24, sliding_window=8, tie_word_embeddings=False,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                         "full_attention": {"rope_type": "default", "rope_theta": 1e4}}),
    # Gemma 3 4B-27B's release, an image-text model: its language model imports, the vision
    # tower is left out; text_config holds only what differs from Gemma3TextConfig's defaults
    "gemma3_image_text": lambda: transformers.Gemma3Config(
        text_config=dict(vocab_size=300, hidden_size=64, intermediate_size=160,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, query_pre_attn_scalar=32, sliding_window=8,
                         max_position_embeddings=64,
                         layer_types=["sliding_attention", "full_attention"]),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, image_size=28, patch_size=14),
        mm_tokens_per_image=4),
    # Gemma 2 9B's shape in small: every 2nd layer global, a window of 8 keys, the query scale
    # of 27B (query_pre_attn_scalar 144 with heads of 128: here 24 with 32), and caps low enough
    # to bite on these weights' scores and logits (the release's 50 and 30 would not)
    "gemma2": lambda: transformers.Gemma2Config(
        **SMALL, intermediate_size=160, num_hidden_layers=2, num_key_value_heads=2, head_dim=32,
        query_pre_attn_scalar=24, sliding_window=8, attn_logit_softcapping=0.05,
        final_logit_softcapping=0.8, tie_word_embeddings=False),
    "mixtral": lambda: transformers.MixtralConfig(**SMALL, intermediate_size=96,
                                                  num_hidden_layers=2, num_key_value_heads=2,
                                                  num_local_experts=4, num_experts_per_tok=2,
                                                  tie_word_embeddings=False),
}


def saved(tmp_path, name, **config_json_changes):
    """A transformers model of CONFIGS[name], saved; config_json_changes edit its config.json
    afterwards (options this project refuses, which transformers would build)."""
    config = CONFIGS[name]()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms and biases off their 1/0 start, so a swap would show
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    folder = tmp_path / name
    model.save_pretrained(str(folder))
    if config_json_changes:
        data = json.loads((folder / "config.json").read_text())
        data.update(config_json_changes)
        (folder / "config.json").write_text(json.dumps(data))
    return model, str(folder)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_imported_model_gives_transformers_logits(name, tmp_path, capsys):
    hf, folder = saved(tmp_path, name)
    out = str(tmp_path / f"{name}.pt")
    assert convert_main(["from-hf", "--hf-dir", folder, "--output", out]) == 0
    printed = capsys.readouterr().out
    assert "checkpoint.init_from=" in printed and "num_layers: 2" in printed
    merged = load_single(out)
    ours = build_single_model(merged).eval()
    tokens = torch.randint(0, 300, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens).transpose(0, 1), hf(tokens).logits,
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa", "qwen2", "qwen3", "llama31_rope",
                                  "qwen3_moe", "mixtral", "mistral_window", "gemma3",
                                  "gemma3_scaled", "gemma2"])
def test_export_then_import_gives_back_our_tensors(name, tmp_path):
    _, folder = saved(tmp_path, name)
    first = import_hf(folder)
    export_hf(first, str(tmp_path / "again"))
    second = import_hf(str(tmp_path / "again"))
    assert set(first.state_dict) == set(second.state_dict)
    for key, tensor in first.state_dict.items():
        assert torch.equal(tensor, second.state_dict[key]), key


MIXTRAL = ["model.vocab_size=500", "model.position_embedding_type=rotary",
           "model.normalization=rmsnorm", "model.activation=swiglu",
           "model.add_bias_linear=false", "model.num_query_groups=2", "model.tie_embeddings=false",
           "model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.router=softmax_renorm"]


def test_mixtral_export_then_import_gives_our_logits(tmp_path, root):
    """Our MoE model (a few training steps), exported to Mixtral and imported back: the model
    built from the imported file gives our logits."""
    from megatron.config import load_config
    from megatron.model import build_model
    from megatron.parallel.state import ParallelState
    from megatron.checkpoint.convert import MergedCheckpoint
    cfg = load_config(f"{root}/examples/local/tiny.yaml", MIXTRAL)
    torch.manual_seed(0)
    model = build_model(cfg, ParallelState.single(), 512, torch.device("cpu")).eval()
    model, merged = trained_moe((model, MergedCheckpoint(cfg, {}, 500, 512, {})))
    export_hf(merged, str(tmp_path / "mixtral"))
    back = import_hf(str(tmp_path / "mixtral"))
    assert back.config.model.moe.router == "softmax_renorm" and back.config.model.moe.num_experts == 4
    ours = build_single_model(back).eval()
    tokens = torch.randint(0, 500, (2, 64))
    with torch.no_grad():
        diff = float((ours(tokens) - model(tokens)).abs().max())
    print(f"Mixtral export and import: max logit difference {diff:.3g}")
    assert diff < 1e-5, diff


def test_unsupported_hugging_face_options_are_named(tmp_path):
    _, folder = saved(tmp_path, "llama_gqa",
                      rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4})
    with pytest.raises(InputError, match="rope_scaling=.*is not supported: expected rope_type "
                                         "default, linear or llama3"):
        import_hf(folder)
    _, folder = saved(tmp_path, "llama_tied_bias", mlp_bias=False)
    with pytest.raises(InputError, match="mlp_bias=False is not supported: expected equal to "
                                         "attention_bias"):
        import_hf(folder)
    _, folder = saved(tmp_path, "qwen3", attention_bias=True)
    with pytest.raises(InputError, match="attention_bias=True is not supported"):
        import_hf(folder)
    _, folder = saved(tmp_path, "qwen3_moe", mlp_only_layers=[1])
    with pytest.raises(InputError, match=r"mlp_only_layers=\[1\] is not supported"):
        import_hf(folder)
    _, folder = saved(tmp_path, "qwen2", use_sliding_window=True)
    with pytest.raises(InputError, match="use_sliding_window=True is not supported"):
        import_hf(folder)
    # Gemma 3's options this model does not implement
    refused = (({"hidden_activation": "silu"}, "hidden_activation='silu'"),
               ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
               ({"layer_types": ["full_attention", "sliding_attention"]},
                "layer_types=['full_attention', 'sliding_attention'] is not supported: expected "
                "every N-th layer full_attention"),
               ({"model_type": "gemma"}, "model_type='gemma' is not supported: expected "
                                         "gpt2, llama"))
    for i, (change, words) in enumerate(refused):
        _, folder = saved(tmp_path / str(i), "gemma3", **change)
        with pytest.raises(InputError, match="is not supported") as e:
            import_hf(folder)
        assert words in str(e.value), str(e.value)
    with pytest.raises(InputError, match="holds no config.json"):
        import_hf(str(tmp_path))


@pytest.mark.parametrize("text,words", [
    ('{"model_type": "llama"}', "lacks 'hidden_size', which a llama config.json holds"),
    ('{"model_type": "gpt2", "n_embd": 64}', "lacks 'n_layer', which a gpt2 config.json holds"),
    ("[1, 2]", "holds a JSON list, not an object"),
    ("{bad", "is not JSON"),
    ('{"model_type": "gpt2", "n_embd": "x", "n_layer": 2, "n_head": 2, "n_positions": 8, '
     '"vocab_size": 10}', "describes a model this trainer refuses: model.hidden_size='x'"),
])
def test_a_config_json_that_is_not_a_whole_config_is_named(tmp_path, text, words):
    """A missing key was a KeyError traceback, a list an AttributeError; a value the model
    refuses named our field with a --set hint, which cannot reach a folder's file."""
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(InputError) as e:
        import_hf(str(tmp_path))
    assert f"{tmp_path}/config.json" in str(e.value) and words in str(e.value), str(e.value)
    assert "--set" not in str(e.value)


def test_init_from_an_imported_model_pads_the_vocabulary_for_the_run(tmp_path):
    """training.init_from with an imported file (300 rows) into a model whose run pads the
    vocabulary to 512: real ids keep transformers' logits, padding rows start at zero."""
    from megatron.config import build_config
    from megatron.model import build_model
    from megatron.parallel.state import ParallelState
    from megatron.checkpoint.hf_import import model_section
    from megatron.checkpoint.init_from import load_initial_weights
    hf, folder = saved(tmp_path, "llama_gqa")
    out = str(tmp_path / "llama.pt")
    assert convert_main(["from-hf", "--hf-dir", folder, "--output", out]) == 0
    section = model_section(json.loads((tmp_path / "llama_gqa" / "config.json").read_text()))
    cfg = build_config({"model": section, "training": {"init_from": out}})
    model = build_model(cfg, ParallelState.single(), 512, torch.device("cpu")).eval()
    copied = load_initial_weights(list(model.named_parameters()), cfg, ParallelState.single(),
                                  512, 300)
    assert copied == len(dict(model.named_parameters()))
    assert model.embedding.word_embeddings.weight[300:].abs().sum() == 0
    tokens = torch.randint(0, 300, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens).transpose(0, 1)[..., :300], hf(tokens).logits,
                                   rtol=1e-4, atol=1e-4)
