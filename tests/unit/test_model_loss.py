"""The TP=1 loss paths (megatron/model/loss.py) against torch's cross-entropy and against the
vocabulary-parallel form they replace on one rank. A failure here localizes to the loss: the
log-softmax path (token_losses), the fused head (head_loss) and its reused buffer."""
import pytest
import torch
import torch.nn.functional as F

from megatron.model import loss as L
from megatron.parallel.cross_entropy import vocab_parallel_cross_entropy
from megatron.parallel.state import ParallelState

SINGLE = ParallelState.single()


def _inputs(dtype, s=16, b=3, v=100):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(s, b, v, generator=g) * 3).to(dtype)
    return logits, torch.randint(0, v, (s, b), generator=g)


def _loss_and_grad(fn, logits, weights):
    z = logits.clone().requires_grad_()
    loss = fn(z)
    (loss * weights).sum().backward()
    return loss, z.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_token_losses_match_torch_and_the_vocab_parallel_form(dtype):
    logits, target = _inputs(dtype)
    w = torch.rand(target.shape, generator=torch.Generator().manual_seed(1))
    ours, g_ours = _loss_and_grad(lambda z: L.token_losses(z, target, SINGLE), logits, w)
    vp, g_vp = _loss_and_grad(lambda z: vocab_parallel_cross_entropy(z, target, SINGLE), logits, w)
    ref, g_ref = _loss_and_grad(lambda z: F.cross_entropy(
        z.double().flatten(0, 1), target.flatten(), reduction="none").view(target.shape),
        logits, w)
    assert ours.dtype == torch.float32 and g_ours.dtype == dtype  # as the vocab-parallel form
    assert torch.allclose(ours.double(), ref, atol=2e-6)
    assert torch.allclose(ours, vp, atol=2e-6)
    assert torch.allclose(g_ours.double(), g_ref.double(), atol=1e-6)
    assert torch.allclose(g_ours.double(), g_vp.double(), atol=1e-6)


def _head(fn, hidden, weight, w):
    h, wt = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss = fn(h, wt)
    (loss * w).sum().backward()
    return loss, h.grad, wt.grad


def test_head_loss_is_linear_then_token_losses_bit_for_bit():
    g = torch.Generator().manual_seed(2)
    hidden, weight = torch.randn(32, 4, 48, generator=g), torch.randn(200, 48, generator=g) * .1
    labels = torch.randint(0, 200, (4, 32), generator=g)  # [b, s] as the model gets them
    target = labels.transpose(0, 1)
    w = torch.rand(32, 4, generator=g)
    assert L.fused_head_applies(hidden, weight, SINGLE)
    ws = L.HeadWorkspace()
    for _ in range(2):  # the second call reuses the buffer the first one gave back
        fused = _head(lambda h, wt: L.head_loss(h, wt, target, ws), hidden, weight, w)
    plain = _head(lambda h, wt: L.token_losses(F.linear(h, wt), target, SINGLE), hidden, weight, w)
    for a, b in zip(fused, plain):
        assert torch.equal(a, b)
    assert ws._free is not None, "the backward gives the buffer back"


def test_head_workspace_lends_one_buffer_at_a_time():
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(8, 2, 16, generator=g, requires_grad=True)
    weight = torch.randn(64, 16, generator=g, requires_grad=True)
    target = torch.randint(0, 64, (8, 2), generator=g)
    ws = L.HeadWorkspace()
    first = L.head_loss(hidden, weight, target, ws)
    second = L.head_loss(hidden, weight, target, ws)  # first still holds the buffer
    assert torch.equal(first, second)
    first.sum().backward()
    lent = ws._free
    second.sum().backward()
    assert ws._free is not lent  # each gave back its own
    with torch.no_grad():  # evaluation keeps nothing and hands the buffer straight back
        kept = ws._free
        L.head_loss(hidden, weight, target, ws)
        assert ws._free is kept


def test_fused_head_applies_only_to_fp32_on_one_cpu_rank():
    h, w = torch.zeros(2, 1, 8), torch.zeros(16, 8)
    assert L.fused_head_applies(h, w, SINGLE)
    assert not L.fused_head_applies(h.bfloat16(), w.bfloat16(), SINGLE)
    assert not L.fused_head_applies(h, w, ParallelState(tp=2))


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("tied", [True, False])
def test_gpt_model_loss_is_the_same_fused_or_not(one_rank_group, tied, masked, monkeypatch):
    from megatron.config import load_config
    from megatron.model import build_model
    import megatron.model.gpt as gpt
    cfg = load_config("examples/local/tiny.yaml", [f"model.tie_embeddings={str(tied).lower()}"])
    model = build_model(cfg, ParallelState.build(1, 1), 512)
    x = torch.randint(0, 512, (3, 65), generator=torch.Generator().manual_seed(4))
    labels = x[:, 1:].clone()
    if masked:  # data.eod_mask_loss's ignored labels
        labels[:, ::7] = -1
    runs = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(gpt, "fused_head_applies", lambda *a: False)
        model.zero_grad()
        loss = model(x[:, :-1], labels)
        loss.backward()
        runs.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    assert torch.equal(runs[0][0], runs[1][0])
    for name, grad in runs[0][1].items():
        assert torch.equal(grad, runs[1][1][name]), name


@pytest.mark.parametrize("overlap", [True, False])
def test_the_backward_tp_overlap_setting_reaches_every_column_parallel_layer(one_rank_group,
                                                                           overlap):
    """parallel.tp_backward_overlap is each column-parallel layer's overlap_backward (QKV, fc1)
    and the output head's (model/embedding.py), resolved once in build_context."""
    from megatron.config import load_config
    from megatron.model import build_model
    from megatron.parallel.layers import ColumnParallelLinear
    cfg = load_config("examples/local/tiny.yaml", [
        f"parallel.tp_backward_overlap={str(overlap).lower()}", "model.tie_embeddings=false"])
    model = build_model(cfg, ParallelState.build(1, 1), 512)
    columns = [m for m in model.modules() if isinstance(m, ColumnParallelLinear)]
    assert len(columns) == 2 * cfg.model.num_layers
    assert all(m.overlap_backward is overlap for m in columns)
    heads = [m for m in model.modules() if hasattr(m, "head")]
    assert heads and all(h.overlap is overlap for h in heads)


def _masked_labels(b=3, s=16, v=100, seed=5):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, v, (b, s), generator=g)
    labels[torch.rand(b, s, generator=g) < 0.3] = -1  # IGNORED_LABEL, data.eod_mask_loss's
    return labels


def test_lm_loss_is_the_mean_over_the_counted_labels():
    from megatron.model.gpt import lm_loss
    logits, _ = _inputs(torch.float32)
    labels = _masked_labels()
    assert 0 < int((labels < 0).sum()) < labels.numel()
    ours, g_ours = _loss_and_grad(lambda z: lm_loss(z, labels, SINGLE), logits, 1.0)
    ref, g_ref = _loss_and_grad(lambda z: F.cross_entropy(
        z.double().flatten(0, 1), labels.t().flatten(), ignore_index=-1), logits, 1.0)
    assert torch.allclose(ours.double(), ref, atol=1e-6)
    assert torch.allclose(g_ours, g_ref, atol=1e-7)
    assert bool((g_ours.transpose(0, 1)[labels < 0] == 0).all())  # ignored: no gradient
    unmasked = labels.clamp(min=0)  # none ignored: the plain mean, bit for bit
    plain = lm_loss(logits, unmasked, SINGLE)
    assert torch.equal(plain, L.token_losses(logits, unmasked.t(), SINGLE).mean())
    nothing, g_nothing = _loss_and_grad(lambda z: lm_loss(z, torch.full_like(labels, -1),
                                                          SINGLE), logits, 1.0)
    assert float(nothing) == 0.0 and not g_nothing.any()


@pytest.mark.parametrize("algo", ["ulysses", "ring"])
def test_context_parallel_shares_add_up_to_the_micro_batch_mean(algo):
    """Each of C ranks holds its own tokens' losses and the whole labels; the mean of the
    ranks' shares (the engine's over the group) is the micro-batch's mean over its counted
    labels, though the ranks hold different numbers of them."""
    from megatron.model.gpt import lm_loss, local_labels
    from megatron.parallel.cp_layout import CPLayout
    from megatron.parallel.ulysses import local_sequence  # noqa: F401  (the layouts' home)
    logits, _ = _inputs(torch.float32)
    labels = _masked_labels()
    whole = lm_loss(logits, labels, SINGLE)
    shares, counts = [], []
    for rank in range(2):
        state = ParallelState(cp=2, rank=rank)
        state.cp_layout = CPLayout.of(algo, 2)
        mine = local_labels(torch.arange(16).expand(3, 16), state)[:, 0]  # this rank's positions
        shares.append(lm_loss(logits[mine], labels, state))
        counts.append(int((labels[:, mine] >= 0).sum()))
    assert counts[0] != counts[1]
    assert torch.allclose((shares[0] + shares[1]) / 2, whole, atol=1e-6)
