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
    from megatron.model.attention_cores import within_documents
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
    mask = within_documents(docs.current)
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


@pytest.mark.parametrize("flavour", ["learned", "rotary"])
def test_a_packed_document_reads_as_alone_with_its_own_positions(one_rank_group, flavour):
    """data.reset_attention_mask with data.reset_position_ids: under learned positions too (a
    table of absolute positions, GPT-2's and the paper's models'), the second document of a
    packed sample gets the logits it gets alone; with the mask alone it does not (its positions
    are 10-23, not 0-13). Rotary positions alone, per sample, rotate as the shared table."""
    from megatron.model import build_context, GPTModel
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
