"""model.rope_scaling: linear and Llama 3.1's llama3 frequencies by hand, the rotary tables the
model builds from them, and the settings' checks. What transformers computes for the same
settings is held in test_checkpoint_hf_export/import."""
import math
from types import SimpleNamespace

import pytest
import torch

from megatron.config import load_config
from megatron.config.errors import ConfigError
from megatron.config.unused import unread_settings
from megatron.model import build_model
from megatron.model.rotary import scaled_frequencies
from megatron.parallel.state import ParallelState
from tests.support.paths import ROOT

TINY = f"{ROOT}/examples/local/tiny.yaml"
ROTARY = ["model.position_embedding_type=rotary", "model.num_layers=1"]


def _llama31(original=8192):
    return SimpleNamespace(type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position_embeddings=original)


def test_llama3_keeps_short_wavelengths_divides_long_ones_and_blends_between():
    """L = 8192, low 1, high 4: a wavelength of 1000 (< L / 4 = 2048) keeps its frequency, one
    of 10000 (> L) takes f / 8, one of 4096 the blend with a = (8192 / 4096 - 1) / 3 = 1/3:
    (2/3) f / 8 + (1/3) f = 10/24 f."""
    wavelengths = torch.tensor([1000.0, 4096.0, 10000.0], dtype=torch.float64)
    f = 2 * math.pi / wavelengths
    got = scaled_frequencies(f, _llama31())
    torch.testing.assert_close(got, torch.stack([f[0], f[1] * 10 / 24, f[2] / 8]))
    linear = SimpleNamespace(type="linear", factor=4.0)
    torch.testing.assert_close(scaled_frequencies(f, linear), f / 4)
    assert scaled_frequencies(f, SimpleNamespace(type="none")) is f


def test_the_models_rotary_tables_use_the_scaled_frequencies():
    cfg = load_config(TINY, ROTARY + ["model.rope_scaling.type=llama3",
                                      "model.rope_scaling.original_max_position_embeddings=16",
                                      "model.rotary_base=500000"])
    rotary = build_model(cfg, ParallelState.single(), 512).layers[0].attention.rotary
    d = cfg.model.head_dim
    f = 1.0 / 500000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    f = scaled_frequencies(f, cfg.model.rope_scaling)
    angles = torch.outer(torch.arange(cfg.model.seq_length, dtype=torch.float64), f)
    expected = torch.cat((angles, angles), dim=-1).cos().float()
    torch.testing.assert_close(rotary._cos[:, 0, 0, :], expected)
    plain = build_model(load_config(TINY, ROTARY + ["model.rotary_base=500000"]),
                        ParallelState.single(), 512).layers[0].attention.rotary
    assert not torch.equal(plain._cos, rotary._cos)


@pytest.mark.parametrize("sets,field,words", [
    (["model.rope_scaling.type=llama3"], "model.rope_scaling.original_max_position_embeddings",
     "the context length the model was first trained on"),
    (["model.rope_scaling.type=llama3", "model.rope_scaling.original_max_position_embeddings=64",
      "model.rope_scaling.high_freq_factor=1"], "model.rope_scaling.high_freq_factor",
     "above model.rope_scaling.low_freq_factor=1.0"),
    (["model.rope_scaling.type=linear", "model.rope_scaling.factor=0"],
     "model.rope_scaling.factor", "a factor > 0"),
    (["model.rope_scaling.type=yarn"], "model.rope_scaling.type", "one of none, linear, llama3"),
])
def test_scaling_settings_are_checked_naming_the_field(sets, field, words):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, ROTARY + sets)
    assert e.value.field == field and words in str(e.value), str(e.value)


def test_scaling_learned_positions_is_refused_and_unread_settings_are_named():
    with pytest.raises(ConfigError, match="model.rope_scaling.type='linear' is invalid: expected "
                                          "none for model.position_embedding_type=learned"):
        load_config(TINY, ["model.position_embedding_type=learned",
                           "model.rope_scaling.type=linear"])
    unread = unread_settings(load_config(TINY, ROTARY + ["model.rope_scaling.factor=4"]))
    assert unread == ["model.rope_scaling.factor=4.0 (model.rope_scaling.type=none)"]
    unread = unread_settings(load_config(TINY, ROTARY + [
        "model.rope_scaling.type=linear", "model.rope_scaling.original_max_position_embeddings=8"]))
    assert unread == ["model.rope_scaling.original_max_position_embeddings=8 "
                      "(model.rope_scaling.type=linear divides every frequency alike)"]
