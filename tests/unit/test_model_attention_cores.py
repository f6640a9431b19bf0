"""The attention cores' dropout stream: with dropout they draw from the sharded ("tp") stream
and leave the default generator where it was; without it they touch neither (no state copies)."""
import pytest
import torch

from megatron.config import load_config
from megatron.model import build_model
from megatron.parallel.state import ParallelState
from tests.support.paths import ROOT


def _core(dropout: float):
    cfg = load_config(f"{ROOT}/examples/local/tiny.yaml", [
        "model.num_layers=1", "model.hidden_size=64", "model.num_attention_heads=4",
        "model.attention_backend=sdpa", f"model.attention_dropout={dropout}"])
    model = build_model(cfg, ParallelState.single(), 512)
    return model.layers[0].attention.core, model


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_the_sharded_stream_serves_dropout_only(dropout):
    core, model = _core(dropout)
    model.train()
    tracker = core.tracker
    q, k, v = (torch.randn(8, 2, 4, 16) for _ in range(3))
    default_before, tp_before = torch.get_rng_state(), tracker.states["tp"].clone()
    forks = []
    real_fork = tracker.fork
    tracker.fork = lambda name="tp": forks.append(name) or real_fork(name)
    out = core(q, k, v)
    assert out.shape == (8, 2, 64)
    assert torch.equal(torch.get_rng_state(), default_before)
    assert forks == (["tp"] if dropout else [])
    assert torch.equal(tracker.states["tp"], tp_before) == (dropout == 0.0)
    if dropout == 0.0:  # the same output as under the fork it no longer takes
        with real_fork("tp"):
            assert torch.equal(core(q, k, v), out)


def _documents_core(backend: str):
    cfg = load_config(f"{ROOT}/examples/local/tiny.yaml", [
        "model.num_layers=1", "model.hidden_size=64", "model.num_attention_heads=4",
        f"model.attention_backend={backend}", "model.num_query_groups=2"])
    return build_model(cfg, ParallelState.single(), 512).layers[0].attention.core


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_attention_within_documents_is_each_document_on_its_own(backend):
    """data.reset_attention_mask: a packed sequence's output is, document by document, what
    each document alone gives, under grouped-query heads; the last token of a document (its
    end-of-document) belongs to it."""
    from megatron.model.attention_cores import visible_keys
    from megatron.model.context import Documents
    core = _documents_core(backend).eval()
    g = torch.Generator().manual_seed(0)
    s, b = 12, 2
    q = torch.randn(s, b, 4, 16, generator=g)
    k, v = torch.randn(s, b, 2, 16, generator=g), torch.randn(s, b, 2, 16, generator=g)
    tokens = torch.tensor([[5, 7, 0, 3, 3, 9, 0, 4, 2, 8, 1, 6],  # 0 is the end-of-document
                           [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 0]])
    docs = Documents(eod=0)
    docs.read(tokens)
    assert docs.current.tolist() == [[0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2], [0] * 12]
    mask = visible_keys(docs.current, None, s, docs.current.device)
    assert mask.shape == (b, 1, s, s) and bool(mask[1, 0].equal(torch.ones(s, s).tril().bool()))
    out = core(q, k, v, documents=docs.current)
    for row in range(b):
        ids = docs.current[row]
        for doc in ids.unique().tolist():
            at = (ids == doc).nonzero().flatten()
            alone = core(q[at][:, row:row + 1], k[at][:, row:row + 1], v[at][:, row:row + 1])
            assert torch.allclose(out[at][:, row:row + 1], alone, atol=1e-6), (row, doc)
    whole = core(q, k, v)  # causal over the whole sequence: the later documents differ
    assert not torch.allclose(whole[3:, 0], out[3:, 0], atol=1e-4)
    assert torch.allclose(whole[:, 1], out[:, 1], atol=1e-6)  # one document: causal


def test_a_packed_document_reads_as_it_does_alone_under_rotary_positions(one_rank_group):
    """The whole model under data.reset_attention_mask with rotary positions (relative): the
    logits of the second document of a packed sample are those of that document alone."""
    from megatron.model import build_context, GPTModel
    cfg = load_config(f"{ROOT}/examples/local/tiny.yaml", [
        "model.position_embedding_type=rotary", "model.normalization=rmsnorm",
        "model.activation=swiglu", "model.attention_backend=sdpa",
        "data.reset_attention_mask=true"])
    state = ParallelState.single()
    masked = GPTModel(cfg.model, build_context(cfg, state, 512, eod=511)).eval()
    plain = GPTModel(cfg.model, build_context(cfg, state, 512)).eval()
    assert masked.documents is not None and plain.documents is None
    plain.load_state_dict(masked.state_dict())
    g = torch.Generator().manual_seed(1)
    first, second = torch.randint(0, 511, (1, 9), generator=g), torch.randint(0, 511, (1, 14),
                                                                             generator=g)
    packed = torch.cat([first, torch.tensor([[511]]), second], dim=1)  # [1, 24]
    with torch.no_grad():
        together = masked(packed)  # [s, b, V]
        alone = plain(second)
        crossing = plain(packed)
    assert torch.allclose(together[10:], alone, atol=1e-4)
    assert not torch.allclose(crossing[10:], alone, atol=1e-2)


def test_positions_restart_after_each_end_of_document():
    """data.reset_position_ids (model/context.Documents): the end-of-document keeps its
    document's next position, the token after it starts at 0 (Megatron's rule)."""
    from megatron.model.context import Documents
    docs = Documents(9, attend_within=False, reset_positions=True)
    docs.read(torch.tensor([[1, 2, 9, 3, 4, 9, 9, 5], [9, 1, 1, 1, 1, 1, 1, 1]]))
    assert docs.positions.tolist() == [[0, 1, 2, 0, 1, 2, 0, 0], [0, 0, 1, 2, 3, 4, 5, 6]]
    assert docs.current.tolist()[0] == [0, 0, 0, 1, 1, 1, 2, 3]


@pytest.mark.parametrize("band_block", [256, 4])
@pytest.mark.parametrize("flavour", ["learned", "rotary"])
def test_a_packed_document_reads_as_alone_with_its_own_positions(one_rank_group, flavour,
                                                                  band_block, monkeypatch):
    """data.reset_attention_mask with data.reset_position_ids: under learned positions too (a
    table of absolute positions, GPT-2's and the paper's models'), the second document of a
    packed sample gets the logits it gets alone; with the mask alone it does not (its positions
    are 10-23, not 0-13). Rotary positions alone, per sample, rotate as the shared table. The
    same with the sequence of 24 attended in bands of 4 queries (attention_bands)."""
    from megatron.config import model_math
    from megatron.model import build_context, GPTModel
    monkeypatch.setattr(model_math, "BAND_BLOCK", band_block)
    sets = ["model.attention_backend=sdpa", "data.reset_attention_mask=true"]
    if flavour == "rotary":
        sets += ["model.position_embedding_type=rotary", "model.normalization=rmsnorm"]
    cfg = load_config(f"{ROOT}/examples/local/tiny.yaml", sets + ["data.reset_position_ids=true"])
    masked_only = load_config(f"{ROOT}/examples/local/tiny.yaml", sets)
    state = ParallelState.single()
    reset = GPTModel(cfg.model, build_context(cfg, state, 512, eod=511)).eval()
    mask = GPTModel(cfg.model, build_context(masked_only, state, 512, eod=511)).eval()
    plain = GPTModel(cfg.model, build_context(cfg, state, 512)).eval()
    mask.load_state_dict(reset.state_dict())
    plain.load_state_dict(reset.state_dict())
    g = torch.Generator().manual_seed(2)
    first, second = torch.randint(0, 511, (2, 9), generator=g), torch.randint(0, 511, (2, 14),
                                                                             generator=g)
    packed = torch.cat([first, torch.full((2, 1), 511), second], dim=1)  # [2, 24]
    with torch.no_grad():
        alone = plain(second)
        assert torch.allclose(reset(packed)[10:], alone, atol=1e-4)
        if flavour == "learned":
            assert not torch.allclose(mask(packed)[10:], alone, atol=1e-2)


def _window_model(backend: str, window: int, pattern: int = 0, layers: int = 1):
    cfg = load_config(f"{ROOT}/examples/local/tiny.yaml", [
        f"model.num_layers={layers}", "model.hidden_size=64", "model.num_attention_heads=4",
        f"model.attention_backend={backend}", "model.num_query_groups=2",
        f"model.attention.sliding_window={window}",
        f"model.attention.sliding_window_pattern={pattern}"])
    return build_model(cfg, ParallelState.single(), 512)


def _reference(q, k, v, visible, cap: float = 0.0):
    """Attention with an explicit [b or 1, 1, s, s] visibility mask, grouped-query heads; with
    `cap`, each scaled score capped at cap x tanh(score / cap) before the mask (Gemma 2)."""
    import math
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
    scores = torch.einsum("ibnd,jbnd->bnij", q, k) / math.sqrt(q.shape[-1])
    if cap:
        scores = cap * torch.tanh(scores / cap)
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    s, b, n, d = q.shape
    return torch.einsum("bnij,jbnd->ibnd", probs, v).reshape(s, b, n * d)


def test_a_sliding_window_shows_each_query_itself_and_the_keys_just_before():
    """model.attention.sliding_window (Hugging Face's rule: key j is seen from query i when
    i - window < j <= i), and sliding_window_pattern: every N-th layer sees the whole
    sequence (layers 2, 4, ... of pattern 2, 0-based 1, 3, ...)."""
    from megatron.model.attention_cores import visible_keys
    mask = visible_keys(None, 3, 6, torch.device("cpu"))[0, 0]
    assert mask.int().tolist() == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                                   [0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]]
    model = _window_model("sdpa", 3, pattern=2, layers=4)
    assert [layer.attention.core.window for layer in model.layers] == [3, None, 3, None]
    assert model.layers[0].attention.core.window == 3
    assert [m.attention.core.window for m in _window_model("math", 5, layers=2).layers] == [5, 5]


@pytest.mark.parametrize("backend", ["sdpa", "math"])
@pytest.mark.parametrize("with_documents", [False, True])
def test_each_core_attends_within_the_window(backend, with_documents):
    """Both CPU cores against attention with the window's explicit mask (grouped-query
    heads), and with packed documents the window and the documents together; without the
    window the output differs (the window hides keys of a long sequence)."""
    from megatron.model.context import Documents
    core = _window_model(backend, 4).layers[0].attention.core.eval()
    g = torch.Generator().manual_seed(3)
    s, b = 12, 2
    q = torch.randn(s, b, 4, 16, generator=g)
    k, v = torch.randn(s, b, 2, 16, generator=g), torch.randn(s, b, 2, 16, generator=g)
    rows, cols = torch.arange(s).unsqueeze(1), torch.arange(s).unsqueeze(0)
    visible = ((cols <= rows) & (cols > rows - 4)).view(1, 1, s, s)
    docs = None
    if with_documents:
        tokens = torch.ones(b, s, dtype=torch.long)
        tokens[0, 6] = tokens[1, 2] = 0
        docs = Documents(eod=0).read(tokens)[0]
        visible = visible & (docs.unsqueeze(2) == docs.unsqueeze(1)).unsqueeze(1)
    out = core(q, k, v, documents=docs) if with_documents else core(q, k, v)
    assert torch.allclose(out, _reference(q, k, v, visible), atol=1e-5)
    causal = (cols <= rows).view(1, 1, s, s)
    assert not torch.allclose(out, _reference(q, k, v, causal), atol=1e-3)


def test_the_bands_of_a_window_cover_each_query_and_the_keys_it_reaches(monkeypatch):
    """Blocks of max(window, BAND_BLOCK) queries, each against the keys from its first query's
    window on; none (the whole sequence at once) for two blocks or fewer."""
    from megatron.config import model_math
    from megatron.model import attention_cores
    monkeypatch.setattr(model_math, "BAND_BLOCK", 4)
    assert model_math.band_blocks(20, 3) == [(0, 4, 0), (4, 8, 2), (8, 12, 6), (12, 16, 10),
                                             (16, 20, 14)]
    assert model_math.band_blocks(13, 6) == [(0, 6, 0), (6, 12, 1), (12, 13, 7)]
    assert model_math.band_blocks(12, 6) is None and model_math.band_blocks(40, None) is None
    whole = attention_cores.visible_keys(None, 3, 20, torch.device("cpu"))[0, 0]
    for q0, q1, k0 in model_math.band_blocks(20, 3):
        part = attention_cores.visible_keys(None, 3, 20, torch.device("cpu"), (q0, q1, k0))
        assert torch.equal(part[0, 0], whole[q0:q1, k0:q1])
        assert not whole[q0:q1, :k0].any()  # nothing visible left of the band


@pytest.mark.parametrize("backend", ["sdpa", "math"])
@pytest.mark.parametrize("with_documents", [False, True])
def test_banded_attention_is_whole_attention_with_gradients(monkeypatch, backend,
                                                            with_documents):
    """A window of 5 over 29 tokens in bands of 5 (the last one short) gives the whole masked
    attention's output and gradients of q, k and v, with grouped-query heads and packed
    documents; the whole sequence's s x s mask is never built."""
    from megatron.config import model_math
    from megatron.model import attention_cores
    from megatron.model.context import Documents
    core = _window_model(backend, 5).layers[0].attention.core.eval()
    g = torch.Generator().manual_seed(5)
    s, b = 29, 2
    q = torch.randn(s, b, 4, 16, generator=g, requires_grad=True)
    k = torch.randn(s, b, 2, 16, generator=g, requires_grad=True)
    v = torch.randn(s, b, 2, 16, generator=g, requires_grad=True)
    docs = None
    if with_documents:
        tokens = torch.ones(b, s, dtype=torch.long)
        tokens[0, 11] = tokens[1, 3] = tokens[1, 20] = 0
        docs = Documents(eod=0).read(tokens)[0]
    grad = torch.randn(s, b, 64, generator=g)
    kwargs = {"documents": docs} if with_documents else {}
    whole = core(q, k, v, **kwargs)
    expected = torch.autograd.grad(whole, (q, k, v), grad)
    monkeypatch.setattr(model_math, "BAND_BLOCK", 5)
    attention_cores._MASKS[:] = [None, {}]
    banded = core(q, k, v, **kwargs)
    assert all(key[3:] != (0, s, 0) for key in attention_cores._MASKS[1])  # bands only
    assert torch.allclose(banded, whole, atol=1e-6)
    for got, want in zip(torch.autograd.grad(banded, (q, k, v), grad), expected):
        assert torch.allclose(got, want, atol=1e-5)


def test_packed_documents_narrow_each_band_to_its_first_querys_document(monkeypatch):
    """Without a window, blocks of BAND_BLOCK queries whose keys start at the earliest start,
    over the samples, of the document holding the block's first query; with a window, the
    later of that and the window's start."""
    from megatron.config import model_math
    from megatron.model.attention_cores import attention_bands
    from megatron.model.context import Documents
    monkeypatch.setattr(model_math, "BAND_BLOCK", 4)
    tokens = torch.ones(2, 16, dtype=torch.long)
    tokens[0, 2] = tokens[0, 9] = tokens[1, 5] = 0  # documents start at 3, 10 and at 6
    docs = Documents(eod=0).read(tokens)[0]
    # query 4: sample 1's first document (to 5); 8: sample 0's from 3; 12: sample 1's from 6
    assert attention_bands(16, None, docs) == [(0, 4, 0), (4, 8, 0), (8, 12, 3), (12, 16, 6)]
    assert attention_bands(16, 3, docs) == [(0, 4, 0), (4, 8, 2), (8, 12, 6), (12, 16, 10)]
    assert attention_bands(8, None, docs) is None  # two blocks or fewer: whole


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_packed_documents_in_bands_are_whole_attention_with_gradients(monkeypatch, backend):
    """Short packed documents over 37 tokens, no window, in bands of 4: the output and the
    gradients of the whole sequence under its document mask."""
    from megatron.config import model_math
    from megatron.model.context import Documents
    cfg = load_config(f"{ROOT}/examples/local/tiny.yaml", [
        "model.num_layers=1", "model.hidden_size=64", "model.num_attention_heads=4",
        f"model.attention_backend={backend}", "model.num_query_groups=2"])
    core = build_model(cfg, ParallelState.single(), 512).layers[0].attention.core.eval()
    g = torch.Generator().manual_seed(9)
    s, b = 37, 2
    q = torch.randn(s, b, 4, 16, generator=g, requires_grad=True)
    k = torch.randn(s, b, 2, 16, generator=g, requires_grad=True)
    v = torch.randn(s, b, 2, 16, generator=g, requires_grad=True)
    tokens = torch.ones(b, s, dtype=torch.long)
    tokens[0, [4, 13, 21, 30]] = tokens[1, [8, 9, 25]] = 0
    docs = Documents(eod=0).read(tokens)[0]
    grad = torch.randn(s, b, 64, generator=g)
    whole = core(q, k, v, documents=docs)
    expected = torch.autograd.grad(whole, (q, k, v), grad)
    monkeypatch.setattr(model_math, "BAND_BLOCK", 4)
    banded = core(q, k, v, documents=docs)
    assert torch.allclose(banded, whole, atol=1e-6)
    for got, want in zip(torch.autograd.grad(banded, (q, k, v), grad), expected):
        assert torch.allclose(got, want, atol=1e-5)


def test_a_core_without_the_window_is_refused_by_name():
    """A plugin core whose record does not say it attends within a window stops at build
    with the cores that do, not silently attending over the whole sequence."""
    import dataclasses
    from megatron.config import variants
    from megatron.config.errors import ConfigError
    from megatron.model.attention import window_error
    cfg = load_config(f"{ROOT}/examples/local/tiny.yaml", ["model.attention.sliding_window=8"])
    plain = dataclasses.replace(variants.get("attention", "sdpa"), name="plain_core",
                                sliding_window=False)
    variants.register(plain)
    try:
        with pytest.raises(ConfigError, match=r"model.attention_backend='plain_core' is invalid: "
                                              r"expected a core that attends within model"
                                              r".attention.sliding_window \(flash, sdpa, math"):
            window_error(cfg.model, "plain_core")
        window_error(cfg.model, "sdpa")
    finally:
        variants.unregister("attention", "plain_core")


@pytest.mark.parametrize("window, with_documents", [(0, False), (5, False), (0, True),
                                                    (5, True)])
def test_the_math_core_caps_its_scores_with_gradients(monkeypatch, window, with_documents):
    """model.attention.logit_softcapping: the math core's output and q, k, v gradients are
    attention over cap x tanh(score / cap), whole, in a window's bands and within packed
    documents; auto picks math on this CPU, where it would pick sdpa (no cap in its kernel)."""
    from megatron.config import model_math
    from megatron.model import attention_cores
    from megatron.model.context import Documents
    monkeypatch.setattr(model_math, "BAND_BLOCK", 5)
    attention_cores._MASKS[:] = [None, {}]
    cfg = load_config(f"{ROOT}/examples/local/tiny.yaml", [
        "model.num_layers=1", "model.hidden_size=64", "model.num_attention_heads=4",
        "model.attention_backend=auto", "model.num_query_groups=2",
        f"model.attention.sliding_window={window}", "model.attention.logit_softcapping=0.7"])
    core = build_model(cfg, ParallelState.single(), 512).layers[0].attention.core.eval()
    assert type(core).__name__ == "MathCore"
    g = torch.Generator().manual_seed(7)
    s, b = 23, 2
    q = torch.randn(s, b, 4, 16, generator=g, requires_grad=True)
    k = torch.randn(s, b, 2, 16, generator=g, requires_grad=True)
    v = torch.randn(s, b, 2, 16, generator=g, requires_grad=True)
    rows, cols = torch.arange(s).unsqueeze(1), torch.arange(s).unsqueeze(0)
    visible = (cols <= rows) & ((cols > rows - window) if window else True)
    visible = visible.view(1, 1, s, s)
    docs = None
    if with_documents:
        tokens = torch.ones(b, s, dtype=torch.long)
        tokens[0, 9] = tokens[1, 3] = tokens[1, 15] = 0
        docs = Documents(eod=0).read(tokens)[0]
        visible = visible & (docs.unsqueeze(2) == docs.unsqueeze(1)).unsqueeze(1)
    out = core(q, k, v, documents=docs) if with_documents else core(q, k, v)
    want = _reference(q, k, v, visible, cap=0.7)
    assert torch.allclose(out, want, atol=1e-5)
    assert not torch.allclose(out, _reference(q, k, v, visible), atol=1e-3)  # the cap bites
    grad = torch.randn(s, b, 64, generator=g)
    for got, expected in zip(torch.autograd.grad(out, (q, k, v), grad),
                             torch.autograd.grad(want, (q, k, v), grad)):
        assert torch.allclose(got, expected, atol=1e-5)


def test_a_core_that_does_not_cap_is_refused_by_name():
    """sdpa asked for under a cap stops at build naming the cores that cap and the one that
    runs here; the output layer's cap takes the logits below it."""
    from megatron.config.errors import ConfigError
    capped = ["model.attention.logit_softcapping=50", "model.output.logit_softcapping=0.5"]
    cfg = load_config(f"{ROOT}/examples/local/tiny.yaml",
                      capped + ["model.attention_backend=sdpa"])
    with pytest.raises(ConfigError, match=r"model.attention_backend='sdpa' is invalid: expected "
                                          r"a core that caps its scores under model.attention"
                                          r".logit_softcapping \(flash, math\); use "
                                          r"model.attention_backend=math"):
        build_model(cfg, ParallelState.single(), 512)
    model = build_model(load_config(f"{ROOT}/examples/local/tiny.yaml", capped),
                        ParallelState.single(), 512).eval()
    logits = model(torch.randint(0, 512, (2, 16)))
    assert logits.abs().max() < 0.5 and logits.abs().max() > 0.1


def test_a_cap_with_packed_documents_needs_a_core_with_both_and_names_what_to_turn_off():
    """Both settings only some cores run: auto takes the first core with both facts (math
    here); a core asked for is told the setting its record lacks, and only that one."""
    from megatron.config.errors import ConfigError
    from megatron.model.attention import resolve_attention_backend
    cpu = torch.device("cpu")
    assert resolve_attention_backend("auto", cpu, "fp32", documents=True, softcap=True) == "math"
    assert resolve_attention_backend("auto", cpu, "fp32", documents=True) == "sdpa"
    for core, off in (("sdpa", "model.attention.logit_softcapping=0"),
                      ("flash", "data.reset_attention_mask=false")):
        with pytest.raises(ConfigError, match=r"a core that caps its scores and takes a "
                                              r"document mask under .* \(math\); use "
                                              rf"model.attention_backend=math, or set {off}$"):
            resolve_attention_backend(core, cpu, "fp32", documents=True, softcap=True)
