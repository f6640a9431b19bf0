"""Schedules, weight-decay groups, FLOPs accounting, vocabulary padding and the synthetic stream:
the arithmetic the loop depends on, checked against hand-worked values."""
import math

import numpy as np
import pytest
import torch

from megatron.config import load_config
from megatron.data import SyntheticTokens, micro_batches
from megatron.data.vocab import padded_vocab_size
from megatron.model import build_model
from megatron.parallel.state import ParallelState
from megatron.training.metrics import model_flops_per_token
from megatron.engine.optimizer import lr_at, param_groups


def opt(**kw):
    return load_config(None, [f"optimizer.{k}={v}" for k, v in kw.items()]).optimizer


def test_warmup_then_cosine_to_min():
    o = opt(lr=1.0, min_lr=0.1, lr_warmup_iters=4, lr_decay_style="cosine")
    assert [lr_at(i, o, 14) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(4, o, 14) == pytest.approx(1.0)
    assert lr_at(9, o, 14) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway through the decay
    assert lr_at(14, o, 14) == pytest.approx(0.1) and lr_at(100, o, 14) == pytest.approx(0.1)


def test_linear_and_constant_decay():
    lin = opt(lr=1.0, min_lr=0.0, lr_decay_style="linear")
    assert lr_at(5, lin, 10) == pytest.approx(0.5)
    const = opt(lr=0.5, min_lr=0.0, lr_decay_style="constant")
    assert lr_at(7, const, 10) == 0.5


@pytest.mark.parametrize("shape, at_r", [("1-sqrt", lambda r: 1 - math.sqrt(r)),
                                         ("linear", lambda r: 1 - r),
                                         ("cosine", lambda r: 0.5 * (1 + math.cos(math.pi * r))),
                                         ("exponential", lambda r: 2 * 0.5 ** r - 1)])
def test_wsd_warms_up_holds_then_decays_over_its_last_steps(shape, at_r):
    """lr 1 to min 0.1: warm-up 2 steps, the decay's end at 10, the last 4 steps decaying
    (steps 6-9 at r = 0, 1/4, 1/2, 3/4), min_lr from step 10."""
    o = opt(lr=1.0, min_lr=0.1, lr_warmup_iters=2, lr_decay_style="wsd", lr_wsd_decay_iters=4,
            lr_wsd_decay_style=shape)
    got = [lr_at(i, o, 10) for i in range(12)]
    assert got[:6] == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert got[6:10] == pytest.approx([0.1 + 0.9 * at_r(r) for r in (0, 0.25, 0.5, 0.75)])
    assert got[10:] == [0.1, 0.1]
    # lr_decay_iters sets the end, not train_iters; a decay as long as the stable part allows
    o = opt(lr=1.0, min_lr=0.0, lr_warmup_iters=2, lr_decay_style="wsd", lr_wsd_decay_iters=8,
            lr_decay_iters=10, lr_wsd_decay_style=shape)
    assert lr_at(2, o, 99) == 1.0 and lr_at(6, o, 99) == pytest.approx(at_r(0.5))


def test_inverse_square_root_falls_from_the_warm_up_with_no_end_and_stops_at_min_lr():
    """lr x sqrt(warm-up / steps taken) after a 4-step warm-up: 1 at step 3, 1/2 at step 15
    (16 steps taken), never below min_lr, the same past train_iters and lr_decay_iters."""
    o = opt(lr=1.0, min_lr=0.2, lr_warmup_iters=4, lr_decay_style="inverse-square-root",
            lr_decay_iters=6)
    assert [lr_at(i, o, 10) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(4, o, 10) == pytest.approx(math.sqrt(4 / 5))
    assert lr_at(15, o, 10) == pytest.approx(0.5)  # past both ends
    assert lr_at(24, o, 10) == pytest.approx(0.4)
    assert lr_at(400, o, 10) == pytest.approx(0.2)  # sqrt(4/401) = 0.0999: min_lr
    # no warm-up: lr at step 0, then lr / sqrt(steps taken)
    o = opt(lr=0.9, min_lr=0.0, lr_decay_style="inverse-square-root")
    assert [lr_at(i, o, 5) for i in (0, 3, 8)] == pytest.approx([0.9, 0.45, 0.3])


def test_wsd_needs_a_decay_length_that_fits_after_the_warm_up():
    from megatron.config import ConfigError, validate_for_world
    with pytest.raises(ConfigError, match=r"optimizer.lr_wsd_decay_iters=None is invalid: "
                                          r"expected the decay's length"):
        opt(lr_decay_style="wsd")
    with pytest.raises(ConfigError, match=r"optimizer.lr_wsd_decay_iters=0 is invalid"):
        opt(lr_decay_style="wsd", lr_wsd_decay_iters=0)
    cfg = load_config(None, ["training.train_iters=10", "optimizer.lr_warmup_iters=3",
                             "optimizer.lr_decay_style=wsd", "optimizer.lr_wsd_decay_iters=8"])
    with pytest.raises(ConfigError, match=r"lr_wsd_decay_iters=8 is invalid: expected at most "
                                          r"the decay's end \(training.train_iters=10\) minus "
                                          r"optimizer.lr_warmup_iters=3, 7"):
        validate_for_world(cfg, 1)
    cfg = load_config(None, ["training.train_iters=10", "optimizer.lr_warmup_iters=3",
                             "optimizer.lr_decay_style=wsd", "optimizer.lr_wsd_decay_iters=7"])
    assert validate_for_world(cfg, 1) == 1


def test_no_weight_decay_on_norms_and_biases():
    cfg = load_config(None, ["model.num_layers=1"])
    model = build_model(cfg, ParallelState.single(), 512)
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"])
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    assert "layers.0.norm1.weight" in no_decay_names and "layers.0.mlp.fc1.bias" in no_decay_names
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_flops_match_narayanan_formula():
    cfg = load_config(None, ["model.num_layers=96", "model.hidden_size=12288",
                             "model.num_attention_heads=96", "model.seq_length=2048"])
    L, h, s, V = 96, 12288, 2048, 51200
    expected = 72 * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h)) / s
    assert model_flops_per_token(cfg.model, V) == pytest.approx(expected, rel=1e-12)


def test_flops_count_swiglu_and_gqa():
    m = load_config(None, ["model.activation=swiglu", "model.num_query_groups=2",
                           "model.ffn_hidden_size=192"]).model
    h, s, d = 64, 64, 16
    per_layer = 2 * h * (4 + 4) * d + 4 * s * 4 * d + 2 * h * h + 3 * 2 * h * 192
    assert model_flops_per_token(m, 512) == pytest.approx(3 * (2 * per_layer + 2 * h * 512))


@pytest.mark.parametrize("vocab,tp,expected", [(50257, 1, 50304), (50257, 4, 50688),
                                               (512, 2, 512), (4096, 8, 4096), (1, 1, 128)])
def test_vocab_padding(vocab, tp, expected):
    assert padded_vocab_size(vocab, 128, tp) == expected


def test_synthetic_stream_is_deterministic_and_shifted():
    src = SyntheticTokens(512, 16, seed=3)
    a, b = src.sample(7), SyntheticTokens(512, 16, seed=3).sample(7)
    assert np.array_equal(a, b) and not np.array_equal(a, src.sample(8))
    tokens, labels = next(micro_batches(src.sample, len(src), 0, 2, 8, 0, 1))
    assert torch.equal(tokens[:, 1:], labels[:, :-1])


def test_data_parallel_ranks_partition_the_global_batch():
    """Every layout consumes the same samples per step: the union over DP ranks and
    micro-batches of one step is exactly samples [k*G, (k+1)*G)."""
    fetched = []
    fn = lambda i: np.full(5, i, dtype=np.int64)  # noqa: E731  (sample i is all i)
    for rank in range(4):
        it = micro_batches(fn, 10 ** 6, 16, 2, 16, rank, 4)
        for _ in range(2 * 2):  # two steps of 16/(2*4) = 2 micro-batches
            fetched += next(it)[0][:, 0].tolist()
    assert sorted(fetched) == list(range(16, 48))


def test_full_layout_init_is_deterministic():
    cfg = load_config(None, ["model.num_layers=1"])
    a = build_model(cfg, ParallelState.single(), 512).state_dict()
    b = build_model(cfg, ParallelState.single(), 512).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not math.isclose(a["layers.0.attention.qkv.weight"].std().item(), 0.0)


def test_synthetic_eod_mask_loss_ignores_the_labels_after_the_last_id():
    """Synthetic data's end-of-document is model.vocab_size - 1 (the null tokenizer's)."""
    from megatron.data import build_iterators
    tiny = "examples/local/tiny.yaml"
    plain = build_iterators(load_config(tiny, ["model.vocab_size=32"]), 0, 1, 0)
    masked = build_iterators(load_config(tiny, ["model.vocab_size=32",
                                                "data.eod_mask_loss=true"]), 0, 1, 0)
    seen = 0
    for _ in range(4):
        (tokens, labels), (m_tokens, m_labels) = next(plain.train), next(masked.train)
        assert torch.equal(tokens, m_tokens)
        at_eod = tokens == 31
        seen += int(at_eod.sum())
        assert bool((m_labels[at_eod] == -1).all()) and torch.equal(m_labels[~at_eod],
                                                                    labels[~at_eod])
    assert seen > 0
    v_tokens, v_labels = next(masked.valid())
    assert bool((v_labels[v_tokens == 31] == -1).all())
