"""Memory exactness: the planner's per-rank parameter, gradient and optimizer bytes against hand
counts and against the real model. A failure here localizes a disagreement between
megatron/planner/params.py (or memory.state_bytes) and megatron/model/ or DeepSpeed."""
import re

import pytest

from megatron.config import load_config
from megatron.planner.layout import stage_layers
from megatron.planner.memory import state_bytes, zero3_gathered_elems
from megatron.planner.params import model_params, padded_vocab, stage_params
from tests.support.hf_configs import HF_CONFIGS

TINY = "examples/local/tiny.yaml"


def tiny(*overrides):
    return load_config(TINY, list(overrides))


def test_padded_vocab_follows_the_data_helper():
    from megatron.data.vocab import padded_vocab_size
    for vocab, tp in ((50257, 1), (50257, 4), (50257, 8), (512, 2), (1000, 3)):
        assert padded_vocab(vocab, 128, tp) == padded_vocab_size(vocab, 128, tp)
    assert padded_vocab(50257, 128, 4) == 50688


def test_tiny_counts_by_hand():
    # h=64, 4 layers, 4 heads, ffn 256, vocab 512, seq 64: LayerNorm, GeLU, biases, tied, learned.
    m = tiny().model
    h, f, v, s = 64, 256, 512, 64
    layer = (2 * 2 * h            # two LayerNorms, weight + bias
             + 3 * h * h + 3 * h  # fused QKV and its bias
             + h * h + h          # attention output and its (replicated) bias
             + f * h + f          # fc1
             + h * f + h)         # fc2
    assert layer == 49984
    whole = 4 * layer + v * h + s * h + 2 * h
    assert stage_params(m, 1, 1, 0).total == whole == 236928  # the trainer logs 236928
    # TP=2: every matrix and column-parallel bias halves; norms and row-parallel biases stay.
    layer_tp2 = 4 * h + (3 * h * h + 3 * h) // 2 + h * h // 2 + h + (f * h + f) // 2 + h * f // 2 + h
    assert stage_params(m, 2, 1, 0).total == 4 * layer_tp2 + v * h // 2 + s * h + 2 * h
    # PP=2, tied: the last stage holds a second copy of the word embedding (no position table).
    first, last = stage_params(m, 1, 2, 0), stage_params(m, 1, 2, 1)
    assert first.total == 2 * layer + v * h + s * h
    assert last.total == 2 * layer + 2 * h + v * h


def test_gqa_swiglu_rmsnorm_untied_by_hand():
    m = tiny("model.activation=swiglu", "model.num_query_groups=2", "model.normalization=rmsnorm",
             "model.add_bias_linear=false", "model.tie_embeddings=false",
             "model.position_embedding_type=rotary").model
    h, d, f = 64, 16, m.ffn_hidden_size
    assert f == 192  # 8h/3 rounded up to 64
    layer = 2 * h + (4 + 2 * 2) * d * h // 2 + h * h // 2 + 2 * f * h // 2 + h * f // 2
    assert stage_params(m, 2, 1, 0).total == 4 * layer + 2 * (512 * h // 2) + h
    assert stage_params(m, 2, 2, 1).total == 2 * layer + 512 * h // 2 + h


def test_uneven_stages_give_first_stages_the_remainder():
    assert stage_layers(96, 5) == [20, 19, 19, 19, 19]
    assert stage_layers(13, 8) == [2, 2, 2, 2, 2, 1, 1, 1]


def test_175b_has_175b_parameters():
    from megatron.planner.models import preset_model
    assert abs(model_params(preset_model("175b")) / 1e9 - 174.6) < 0.1


def test_mixed_precision_bytes_per_parameter():
    n = 1_000_000
    # ZeRO-0 with fp16: 2 (weights) + 2 (grads) + 4 + 4 + 4 (master, Adam moments)
    s = state_bytes(n, 0, "fp16", 0, 1, 8, 5e8)
    assert (s.weights, s.grads, s.optimizer) == (2 * n, 2 * n, 12 * n)
    # ZeRO-1 shards the 12 optimizer bytes, ZeRO-2 also the gradients, ZeRO-3 also the weights
    z1, z2, z3 = (state_bytes(n, 0, "bf16", z, 1, 8, 5e8) for z in (1, 2, 3))
    assert (z1.weights, z1.grads, z1.optimizer) == (2 * n, 2 * n, 12 * n / 8)
    assert (z2.weights, z2.grads) == (2 * n, 2 * n / 8)
    # ZeRO-3 also holds gathered weights at the peak: all of them under its 1e9 reuse distance
    assert z3.weights == 2 * n / 8 + 2 * n and z3.grads == 2 * n / 8
    assert zero3_gathered_elems(3e9, 1e6) == 1e9 + 2e6
    # fp32 without ZeRO: the torch optimizer, no master copy
    f = state_bytes(n, 0, "fp32", 0, 1, 8, 5e8)
    assert (f.weights, f.grads, f.optimizer) == (4 * n, 4 * n, 8 * n)


LAYOUTS = [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (1, 4), (2, 4)]
VARIANTS = [(), ("model.activation=swiglu", "model.num_query_groups=2",
                 "model.normalization=rmsnorm", "model.add_bias_linear=false",
                 "model.tie_embeddings=false", "model.position_embedding_type=rotary"),
            ("model.activation=swiglu", "model.num_query_groups=2",
             "model.attention.kv_channels=24",
             "model.normalization=rmsnorm", "model.add_bias_linear=false",
             "model.attention.add_qkv_bias=true", "model.attention.qk_norm=true",
             "model.position_embedding_type=rotary"),
            ("model.attention.kv_channels=8", "model.attention.qk_norm=true")]


def _measured_stage_params(cfg, tp, pp, rank):
    """Parameters the real model puts on `rank`: build_model for PP=1; for PP>1 the pipeline
    layer list cut where DeepSpeed's `type:TransformerLayer` partitioning cuts it."""
    from deepspeed.runtime import utils as ds_utils
    from megatron.model import build_context, build_model, pipeline_layers
    from megatron.parallel.state import ParallelState

    m = cfg.model
    state = ParallelState(tp=tp, pp=pp, dp=1, rank=rank)
    vocab = padded_vocab(m.vocab_size, m.make_vocab_size_divisible_by, tp)
    if pp == 1:
        return sum(p.numel() for p in build_model(cfg, state, vocab).parameters())
    layers = pipeline_layers(m, build_context(cfg, state, vocab))
    weights = [1 if re.search("TransformerLayer", layer.cls.__name__) else 0 for layer in layers]
    parts = ds_utils.partition_balanced(weights=weights, num_parts=pp)
    stage = state.pp_rank
    mods = [layer.cls(*layer.args) for layer in layers[parts[stage]:parts[stage + 1]]]
    return sum(p.numel() for mod in mods for p in mod.parameters())


@pytest.mark.parametrize("variant", VARIANTS, ids=["gpt", "llama-like", "qwen-like", "gpt-qk-norm"])
@pytest.mark.parametrize("tp,pp", LAYOUTS)
def test_per_rank_params_equal_the_real_model(tp, pp, variant):
    pytest.importorskip("megatron.model.gpt")
    cfg = tiny(*variant)
    for rank in range(tp * pp):
        stage = rank // tp
        predicted = stage_params(cfg.model, tp, pp, stage).total
        assert predicted == _measured_stage_params(cfg, tp, pp, rank), (tp, pp, rank)


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_a_hugging_face_config_is_priced_with_transformers_own_count(name, tmp_path):
    """megatron-plan --model config.json: the planner's parameter count is what transformers
    builds from the same config.json (on the meta device), to the parameter; Llama 3.1 8B is
    its published 8,030,261,248."""
    import json
    from megatron.planner.models import preset_model
    from megatron.planner.params import model_params
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF_CONFIGS[name]))
    m = preset_model(str(path), 4096)
    assert m.seq_length == 4096 and m.max_position_embeddings >= 4096
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.from_pretrained(str(tmp_path)))
    theirs = sum(p.numel() for p in hf.parameters())
    assert model_params(m) == theirs, (name, model_params(m), theirs)
    if name == "llama3.1-8b":
        assert theirs == 8_030_261_248 and m.rope_scaling.type == "llama3"
    if name == "gemma3-1b":  # keras-hub's gemma3_1b preset states the same count
        assert theirs == 999_885_952 and m.residual.post_norms


@pytest.mark.parametrize("size, text_config, published", [
    ("4b", dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=34,
                num_attention_heads=8, num_key_value_heads=4, sliding_window=1024),
     3_880_099_328),
    ("12b", dict(hidden_size=3840, intermediate_size=15360, num_hidden_layers=48,
                 num_attention_heads=16, num_key_value_heads=8, sliding_window=1024),
     11_765_788_416)])
def test_gemma3s_image_text_configs_are_priced_as_their_language_model(size, text_config,
                                                                        published):
    """Gemma 3 4B and 12B ship as image-text models whose config.json's text_config holds only
    what differs from Gemma3TextConfig's defaults (their hub files, plus the global layers'
    linear rope scaling by 8): the planner counts the language model, the parameters keras-hub's
    gemma3_4b_text and gemma3_12b_text presets state (at their vocabulary of 262144; the hub's
    config pads it to 262208)."""
    from megatron.config.hf_models import hf_model_config
    from megatron.planner.params import model_params
    hf = {"model_type": "gemma3", "text_config": dict(
        text_config, vocab_size=262144, rope_scaling={"factor": 8.0, "rope_type": "linear"})}
    m = hf_model_config(hf, "config.json").model
    assert model_params(m) == published
    assert (m.attention.sliding_window_pattern, m.attention.window_rotary_base,
            m.rotary_base, m.rope_scaling.factor) == (6, 1e4, 1e6, 8.0)


def test_a_missing_or_refused_hugging_face_config_is_named(tmp_path):
    from megatron.config.errors import InputError
    from megatron.planner.models import preset_model
    with pytest.raises(InputError, match="nothere.json' does not exist: expected a Hugging "
                                         "Face config.json"):
        preset_model(str(tmp_path / "nothere.json"))
    (tmp_path / "config.json").write_text('{"model_type": "qwen2_moe", "hidden_size": 64}')
    with pytest.raises(InputError, match="model_type='qwen2_moe' is not supported"):
        preset_model(str(tmp_path))
