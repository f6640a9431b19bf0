"""Gemma 3's layer, part by part (transformers' own Gemma 3 is held against the whole model in
test_checkpoint_hf_import.py, and TP, PP, Ulysses and ring context parallelism against one rank
in tests/distributed/test_training_equivalence.py): GeGLU by hand, the norms after the sub-blocks
(zeroed, the layer passes its input through), the embedding's multiplier rounded to the
activations' dtype, each layer's rotary base and scaling, the planner's parameter count, and
the settings' checks and unread-setting warnings."""
import math

import pytest
import torch

from megatron.config import ConfigError, load_config
from megatron.config.unused import unread_settings
from megatron.model import build_model
from megatron.model.mlp import bias_geglu
from megatron.parallel.state import ParallelState
from megatron.planner.params import model_params

GEMMA = ["model.activation=geglu", "model.normalization=rmsnorm",
         "model.position_embedding_type=rotary", "model.add_bias_linear=false",
         "model.attention.qk_norm=true", "model.residual.post_norms=true",
         "model.residual.embedding_multiplier=8.0", "model.attention.sliding_window=16",
         "model.attention.sliding_window_pattern=2", "model.attention.window_rotary_base=100.0",
         "model.rope_scaling.type=linear", "model.rope_scaling.factor=4.0",
         "model.attention_backend=sdpa"]


def gemma(tiny, *extra):
    cfg = load_config(tiny, GEMMA + list(extra))
    torch.manual_seed(0)
    return cfg, build_model(cfg, ParallelState.single(), cfg.model.vocab_size).eval()


@pytest.fixture
def tiny(root):
    return f"{root}/examples/local/tiny.yaml"


def test_geglu_is_the_tanh_gelu_of_the_gate_times_the_up_half():
    y = torch.tensor([[1.0, -2.0, 3.0, 0.5]])  # [gate 1, -2; up 3, 0.5]
    tanh_gelu = [0.5 * g * (1 + math.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
                 for g in (1.0, -2.0)]
    want = torch.tensor([[tanh_gelu[0] * 3.0, tanh_gelu[1] * 0.5]])
    torch.testing.assert_close(bias_geglu(y, None, None), want)
    torch.testing.assert_close(bias_geglu(y, torch.ones(4), None),
                               bias_geglu(y + 1, None, None))


def test_zeroed_post_norms_pass_the_residual_stream_through(tiny):
    """x + post_norm(attn(norm(x))): with the post-norms' weights at zero, neither sub-block adds
    anything, whatever it computes; with them at one, the layer moves its input."""
    _, model = gemma(tiny)
    layer = model.layers[0]
    x = torch.randn(64, 2, model.layers[0].norm1.weight.numel())
    with torch.no_grad():
        assert not torch.allclose(layer(x), x)
        layer.post_attention_norm.weight.zero_()
        layer.post_mlp_norm.weight.zero_()
        torch.testing.assert_close(layer(x), x, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_embedding_is_scaled_in_the_activations_dtype(tiny, dtype):
    """Gemma's sqrt(hidden), here Gemma 3 270M's sqrt(640) = 25.298: in bf16 it rounds to 25.25
    before it multiplies, as Gemma's own normaliser does; the tied output layer reads the table
    as is."""
    cfg, model = gemma(tiny, f"model.residual.embedding_multiplier={math.sqrt(640)}")
    model = model.to(dtype)
    tokens = torch.tensor([[3, 5, 7]])
    with torch.no_grad():
        out = model.embedding(tokens)  # [s, b, h]
    table = model.embedding.word_embeddings.weight
    scale = torch.tensor(math.sqrt(640), dtype=dtype)
    assert (float(scale) == 25.25) == (dtype == torch.bfloat16)
    torch.testing.assert_close(out[:, 0], table[[3, 5, 7]] * scale, rtol=0, atol=0)


def test_each_layer_rotates_with_its_own_base_and_scaling(tiny):
    """Layer 0 sees a window: base 100, unscaled; layer 1 sees every key: rotary_base, its
    frequencies divided by rope_scaling's factor 4."""
    cfg, model = gemma(tiny)
    m = cfg.model
    d = m.head_dim
    local, full = model.layers[0].attention.rotary, model.layers[1].attention.rotary
    want_local = [100.0 ** (-i / d) for i in range(0, d, 2)]
    want_full = [m.rotary_base ** (-i / d) / 4.0 for i in range(0, d, 2)]
    assert local._inv_freq.tolist() == pytest.approx(want_local, rel=1e-12)
    assert full._inv_freq.tolist() == pytest.approx(want_full, rel=1e-12)


def test_the_planner_counts_the_post_norms(tiny):
    cfg, model = gemma(tiny)
    assert model_params(cfg.model) == sum(p.numel() for p in model.parameters())
    plain = load_config(tiny, GEMMA + ["model.residual.post_norms=false"]).model
    assert model_params(cfg.model) - model_params(plain) == 2 * 4 * 64  # 2 a layer, 4 layers of 64


@pytest.mark.parametrize("override, words", [
    ("model.residual.embedding_multiplier=0", "model.residual.embedding_multiplier=0"),
    ("model.residual.embedding_multiplier=-2", "model.residual.embedding_multiplier=-2"),
    ("model.attention.window_rotary_base=-1", "model.attention.window_rotary_base=-1"),
    ("model.attention.softmax_scale=0", "model.attention.softmax_scale=0"),
])
def test_out_of_range_settings_are_refused(override, words):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert str(e.value).startswith(words)


def test_a_rotary_base_no_window_or_rotation_reads_is_named():
    named = " ".join(unread_settings(load_config(None, ["model.attention.window_rotary_base=1e4"])))
    assert "model.attention.window_rotary_base=10000.0 (model.attention.sliding_window=0" in named
    learned = load_config(None, ["model.attention.window_rotary_base=1e4",
                                 "model.attention.sliding_window=8",
                                 "model.position_embedding_type=learned"])
    assert "rotate no queries or keys" in " ".join(unread_settings(learned))


def test_the_residual_sub_section_loads_nested_and_dotted(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  residual:\n    post_norms: true\n    embedding_multiplier: 2.0\n")
    nested = load_config(str(path)).model.residual
    dotted = load_config(None, ["model.residual.post_norms=true",
                                "model.residual.embedding_multiplier=2.0"]).model.residual
    assert nested == dotted and nested.post_norms and nested.embedding_multiplier == 2.0
