"""model.attention: each head's width (kv_channels), q/k/v biases alone (add_qkv_bias) and the
per-head query/key norm (qk_norm). What transformers computes for Qwen2/Qwen3 is held in
test_checkpoint_hf_export/import; here the layer itself, the settings' checks, and a norm plugin
that cannot be built per head."""
import pytest
import torch

from megatron.config import load_config, variants
from megatron.config.errors import ConfigError
from megatron.model import build_model
from megatron.parallel.state import ParallelState
from tests.support.paths import ROOT

TINY = f"{ROOT}/examples/local/tiny.yaml"
ROTARY = ["model.position_embedding_type=rotary", "model.normalization=rmsnorm",
          "model.num_layers=1", "model.num_query_groups=2"]


def test_the_norm_is_each_heads_rms_norm_before_rotary():
    """The layer's q and k, recomputed by hand from its projection: each head's rows over its
    24 channels, RMS-normalised with the norm's own weights, then rotated; the output is the
    causal attention of those."""
    cfg = load_config(TINY, ROTARY + ["model.attention.kv_channels=24",
                                      "model.attention.qk_norm=true", "model.norm_epsilon=1e-6",
                                      "model.attention_backend=math"])
    layer = build_model(cfg, ParallelState.single(), 512).layers[0].attention.eval()
    with torch.no_grad():
        layer.q_norm.weight.uniform_(0.5, 1.5)
        layer.k_norm.weight.uniform_(0.5, 1.5)
        x = torch.randn(10, 3, 64)
        q, k, v = layer._split(layer.qkv(x))

        def rms(t, w):
            return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        q = layer.rotary.apply(rms(q, layer.q_norm.weight), layer.sel)
        k = layer.rotary.apply(rms(k, layer.k_norm.weight), layer.sel)
        k, v = (t.repeat_interleave(2, dim=2) for t in (k, v))  # 2 query heads a group
        scores = torch.einsum("sbnd,tbnd->bnst", q, k) / 24 ** 0.5
        scores = scores.masked_fill(torch.ones(10, 10).triu(1).bool(), float("-inf"))
        ctx = torch.einsum("bnst,tbnd->sbnd", scores.softmax(-1), v).reshape(10, 3, 96)
        torch.testing.assert_close(layer(x), layer.dense(ctx), rtol=1e-5, atol=1e-5)


def test_shapes_of_the_projections_and_their_biases():
    cfg = load_config(TINY, ROTARY + ["model.add_bias_linear=false",
                                      "model.attention.add_qkv_bias=true",
                                      "model.attention.kv_channels=8"])
    attention = build_model(cfg, ParallelState.single(), 512).layers[0].attention
    shapes = {n: tuple(p.shape) for n, p in attention.named_parameters()}
    # 4 query heads and 2 key/value heads of 8: (4 + 2 + 2) x 8 rows; no bias on the output
    assert shapes == {"qkv.weight": (64, 64), "qkv.bias": (64,), "dense.weight": (64, 32)}


@pytest.mark.parametrize("sets,field,words", [
    (["model.attention.kv_channels=25"] + ROTARY, "model.attention.kv_channels",
     "an even head width for model.position_embedding_type=rotary"),
    (["model.hidden_size=60", "model.num_attention_heads=4"] + ROTARY, "model.hidden_size",
     "an even head width"),
    (["model.attention.kv_channels=0"], "model.attention.kv_channels", "positive"),
    (["model.hidden_size=66", "model.num_attention_heads=4"], "model.hidden_size",
     "a multiple of model.num_attention_heads=4"),
])
def test_head_widths_are_checked_naming_the_field(sets, field, words):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, sets)
    assert e.value.field == field and words in str(e.value), str(e.value)
    # a width of its own lifts the multiple rule: 66 / 4 heads of 16
    load_config(TINY, ["model.hidden_size=66", "model.num_attention_heads=4",
                       "model.attention.kv_channels=16"])


def test_a_yaml_sub_section_and_a_saved_configs_mapping_load(tmp_path):
    path = tmp_path / "qwen.yaml"
    path.write_text("model:\n  attention:\n    kv_channels: 32\n    qk_norm: true\n")
    cfg = load_config(str(path))
    assert (cfg.model.head_dim, cfg.model.attention.qk_norm, cfg.model.qkv_bias) == (32, True, True)
    from megatron.config import Config
    again = Config.from_dict(cfg.to_dict())
    assert again.model.attention == cfg.model.attention


class _PlainNorm(torch.nn.Module):
    """A norm plugin written for (model, context) alone."""

    def __init__(self, m, ctx):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(m.hidden_size))

    def forward(self, x):
        return x * self.weight


def test_a_norm_plugin_that_cannot_be_built_per_head_is_named():
    variants.register(variants.Variant("norm", "plainnorm", _PlainNorm,
                                       weights=(variants.Weight("weight",
                                                                lambda m: (m.hidden_size,)),)))
    try:
        cfg = load_config(TINY, ["model.normalization=plainnorm", "model.attention.qk_norm=true"])
        with pytest.raises(ConfigError, match="model.normalization=plainnorm's module _PlainNorm "
                                              "does not take the width= and per_rank= keywords"):
            build_model(cfg, ParallelState.single(), 512)
        cfg = load_config(TINY, ["model.normalization=plainnorm"])
        build_model(cfg, ParallelState.single(), 512)  # without qk_norm it serves as before
    finally:
        variants.unregister("norm", "plainnorm")


def test_q_k_v_biases_alone_are_named_unread_beside_every_layers_biases():
    from megatron.config.unused import unread_settings
    assert unread_settings(load_config(TINY, ["model.attention.add_qkv_bias=true"])) == [
        "model.attention.add_qkv_bias=true (model.add_bias_linear=true puts biases on q, k and v "
        "already)"]
    assert unread_settings(load_config(TINY, ["model.attention.add_qkv_bias=true",
                                              "model.add_bias_linear=false"])) == []
