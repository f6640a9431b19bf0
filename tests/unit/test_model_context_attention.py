"""Ring and all-gather attention without processes: the blockwise attention of every rank's
load-balanced tokens, merged through the log-sum-exp, equals full causal attention (outputs
and the gradients of q, k and v), for ring degrees 2, 3 and 4, multi-head and grouped-query.
The ring's shift and the all-gather are replaced by handing each simulated rank the other
ranks' tensors, so a failure here is the chunking, the masks or the merge, not the transport.
The simulated ring runs the autograd form (an identity attention dropout selects it); the
explicit backward's block step (block_attention_backward) is checked here against autograd,
and the whole explicit ring on real ranks (tests/distributed/test_parallel_ring_attention.py).
Under a document mask (data.reset_attention_mask) the same equalities hold against attention
within documents, with key blocks that hide every key from some queries (a row that sees
nothing in a block until a later one, the merge's -inf case). With the scores capped
(model.attention.logit_softcapping) all of it holds against capped attention, the explicit
backward passing the tanh's derivative on."""
import math

import pytest
import torch

from megatron.model import block_attention as ba
from megatron.model import context_attention as ca
from megatron.model.context import Documents
from megatron.parallel.cp_layout import ring_positions

TOLERANCE = 1e-5


def _full(q, k, v, doc=None, window=None, cap=0.0):
    """Reference causal attention, q [s, b, n, d], k/v [s, b, g, d] -> [s, b, n, d] (fp64);
    doc [b, s]: each token's document, attended within; window: keys j > i - window only;
    cap: each scaled score cap x tanh(score / cap) (Gemma 2's attn_logit_softcapping)."""
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
    scores = torch.einsum("ibnd,jbnd->bnij", q, k) / math.sqrt(q.shape[-1])
    if cap:
        scores = cap * torch.tanh(scores / cap)
    s = q.shape[0]
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    if doc is not None:
        other = (doc.unsqueeze(2) != doc.unsqueeze(1)).unsqueeze(1)  # [b, 1, s, s]
        scores = scores.masked_fill(other, float("-inf"))
    if window is not None:
        far = torch.ones(s, s, dtype=torch.bool).tril(-window)  # i - j >= window
        scores = scores.masked_fill(far, float("-inf"))
    return torch.einsum("bnij,jbnd->ibnd", scores.softmax(-1), v)


def _documents(seq):
    """[2, seq] document indices as the model reads them (model/context.Documents): sample 0
    with ends at 2 and in the middle, sample 1 ends every 3 tokens (a chunk's length here), so
    every query chunk sees no key of another chunk."""
    tokens = torch.ones(2, seq, dtype=torch.long)
    tokens[0, [2, seq // 2]] = 0
    tokens[1, 2::3] = 0
    return Documents(eod=0).read(tokens)[0]


def _identity(probs):
    return probs


def _inputs(seq, heads, groups):
    g = torch.Generator().manual_seed(seq * 10 + groups)
    return [torch.randn(seq, 2, h, 8, generator=g, dtype=torch.float64, requires_grad=True)
            for h in (heads, groups, groups)]


def _simulated(fn, q, k, v, ring, monkeypatch, doc=None, window=None, cap=0.0):
    """Every ring rank's output, scattered back to sequence order: [s, b, n, d]."""
    seq = q.shape[0]
    index = [ring_positions(seq, r, ring) for r in range(ring)]
    kvs = [torch.cat([k[i], v[i]], dim=2) for i in index]  # what each rank sends
    out = torch.zeros(q.shape, dtype=torch.float64)
    for r in range(ring):
        steps = iter(range(1, ring))
        monkeypatch.setattr(ca, "ring_shift", lambda x, group: kvs[(r - next(steps)) % ring])
        monkeypatch.setattr(ca, "gather_from_sequence_parallel_region",
                            lambda x, group: torch.cat(kvs))
        got = fn(q[index[r]], k[index[r]], v[index[r]], None, r, ring, drop=_identity, doc=doc,
                 window=window, cap=cap)
        out = out.index_put((index[r],), got.double())
    return out


@pytest.mark.parametrize("algo", ["ring", "allgather"])
@pytest.mark.parametrize("heads, groups", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("ring", [2, 3, 4])
def test_merged_blocks_equal_full_causal_attention(monkeypatch, ring, heads, groups, algo):
    q, k, v = _inputs(2 * ring * 3, heads, groups)
    want = _full(q, k, v)
    got = _simulated(ca.ALGORITHMS[algo], q, k, v, ring, monkeypatch)
    assert (got - want).abs().max() <= TOLERANCE
    grad = torch.randn_like(want)
    expected = torch.autograd.grad(want, (q, k, v), grad)
    for name, a, b in zip("qkv", torch.autograd.grad(got, (q, k, v), grad), expected):
        assert (a - b).abs().max() <= TOLERANCE, f"{algo} R={ring}: d{name} differs"


@pytest.mark.parametrize("algo", ["ring", "allgather"])
@pytest.mark.parametrize("heads, groups", [(4, 4), (4, 1)])
@pytest.mark.parametrize("ring", [2, 3, 4])
def test_merged_blocks_equal_attention_within_documents(monkeypatch, ring, heads, groups, algo):
    q, k, v = _inputs(2 * ring * 3, heads, groups)
    doc = _documents(q.shape[0])
    want = _full(q, k, v, doc)
    got = _simulated(ca.ALGORITHMS[algo], q, k, v, ring, monkeypatch, doc)
    assert not got.isnan().any() and (got - want).abs().max() <= TOLERANCE
    assert (got - _full(q, k, v)).abs().max() > 0.1  # the mask changes the result
    grad = torch.randn_like(want)
    expected = torch.autograd.grad(want, (q, k, v), grad)
    for name, a, b in zip("qkv", torch.autograd.grad(got, (q, k, v), grad), expected):
        assert (a - b).abs().max() <= TOLERANCE, f"{algo} R={ring}: d{name} differs"


@pytest.mark.parametrize("algo", ["ring", "allgather"])
@pytest.mark.parametrize("with_documents", [False, True])
@pytest.mark.parametrize("window", [1, 4, 7])
@pytest.mark.parametrize("ring", [2, 4])
def test_merged_blocks_equal_attention_within_a_sliding_window(monkeypatch, ring, window,
                                                               with_documents, algo):
    """model.attention.sliding_window: chunks of 3 tokens, so a window of 4 or 7 hides part
    of some blocks and the whole of others (the ring skips those pairs), 1 every key but the
    query's own; with packed documents too."""
    q, k, v = _inputs(2 * ring * 3, 4, 2)
    doc = _documents(q.shape[0]) if with_documents else None
    want = _full(q, k, v, doc, window)
    got = _simulated(ca.ALGORITHMS[algo], q, k, v, ring, monkeypatch, doc, window)
    assert not got.isnan().any() and (got - want).abs().max() <= TOLERANCE
    longest = q.shape[0] if doc is None else max(int(row.bincount().max()) for row in doc)
    if window < longest:  # the window hides keys the documents alone leave visible
        assert (got - _full(q, k, v, doc)).abs().max() > 0.1
    grad = torch.randn_like(want)
    expected = torch.autograd.grad(want, (q, k, v), grad)
    for name, a, b in zip("qkv", torch.autograd.grad(got, (q, k, v), grad), expected):
        assert (a - b).abs().max() <= TOLERANCE, f"{algo} R={ring} w={window}: d{name} differs"


def test_the_ring_skips_the_pairs_a_window_hides_whole():
    """Ring rank 0 of 4 holds chunks 0 and 7 of 8 (3 tokens each): with a window of 4, chunk
    7's queries (positions 21-23) see nothing of chunks 0-5, so of the pairs a causal mask
    leaves only (7, 7) and (7, 6) are computed beside (0, 0)."""
    def computed(window):
        return sorted((ca.chunks_of(0, 4)[i], ca.chunks_of(-s % 4, 4)[j])
                      for s in range(4) for i, j, _ in ca._pairs(0, 4, s, window, 3))
    assert computed(None) == [(0, 0), (7, 0), (7, 1), (7, 2), (7, 3), (7, 4), (7, 5), (7, 6),
                              (7, 7)]
    assert computed(4) == [(0, 0), (7, 6), (7, 7)]


@pytest.mark.parametrize("window", [None, 2, 4])
@pytest.mark.parametrize("heads, groups", [(4, 4), (4, 2)])
def test_explicit_ring_backward_within_documents(heads, groups, window):
    """The explicit forward and backward (_RingAttention, no dropout) on one ring rank, whose
    two chunks are the whole sequence: the late chunk's queries see no key of the early one in
    sample 1 (the merge of a hidden block first, then the diagonal)."""
    q, k, v = _inputs(6, heads, groups)
    doc = _documents(6)
    want = _full(q, k, v, doc, window)
    got = ca.ring_attention(q, k, v, None, 0, 1, doc=doc, window=window)
    assert (got - want).abs().max() <= TOLERANCE
    grad = torch.randn_like(want)
    expected = torch.autograd.grad(want, (q, k, v), grad)
    for name, a, b in zip("qkv", torch.autograd.grad(got, (q, k, v), grad), expected):
        assert (a - b).abs().max() <= TOLERANCE, f"d{name} differs"


def test_a_row_that_sees_no_key_in_either_block_merges_to_nothing():
    q, k, v = (torch.randn(2, 1, 1, 4) for _ in range(3))
    hidden = torch.ones(1, 1, 2, 2, dtype=torch.bool)
    out, lse = ba.block_attention(q, k, v, None, hidden=hidden)
    assert out.abs().max() == 0 and (lse == float("-inf")).all()
    merged, merged_lse = ba.merge(out, lse, out, lse, masked=True)
    assert merged.abs().max() == 0 and (merged_lse == float("-inf")).all()
    seen = ba.block_attention(q, k, v, None)
    both = ba.merge(out, lse, *seen, masked=True)
    assert torch.allclose(both[0], seen[0]) and torch.allclose(both[1], seen[1])


def test_merge_of_two_key_halves_is_attention_over_both():
    q, k, v = (torch.randn(5, 1, 2, 4, dtype=torch.float64) for _ in range(3))
    whole, lse = ba.block_attention(q, k, v, None)
    merged, merged_lse = ba.merge(*ba.block_attention(q, k[:2], v[:2], None),
                                  *ba.block_attention(q, k[2:], v[2:], None))
    assert torch.allclose(merged, whole, atol=1e-6) and torch.allclose(merged_lse, lse)


def test_offset_mask_lets_query_i_see_keys_up_to_i_plus_offset():
    q, k, v = (torch.randn(3, 1, 1, 4) for _ in range(3))
    ones = torch.ones(6, 1, 1, 4)
    out, _ = ba.block_attention(q, k.new_zeros(6, 1, 1, 4), torch.arange(6.).view(6, 1, 1, 1)
                                * ones, offset=2)
    # equal scores: each query averages the values of the keys it sees (0..i+2)
    assert out[:, 0, 0, 0].tolist() == pytest.approx([1.0, 1.5, 2.0])


@pytest.mark.parametrize("heads, groups", [(4, 4), (4, 2), (4, 1)])
def test_block_backward_summed_over_key_blocks_is_the_attention_gradient(heads, groups):
    """The explicit ring backward's step: with the final log-sum-exp of each query row, the
    per-block gradients (a causal diagonal block and an earlier one) sum to autograd's."""
    q, k, v = _inputs(12, heads, groups)
    qs, ks, vs = q[6:], (k[:6], k[6:]), (v[:6], v[6:])  # the later query half
    parts = [ba.block_attention(qs, ks[0], vs[0], None), ba.block_attention(qs, ks[1], vs[1], 0)]
    out, lse = ba.merge(*parts[0], *parts[1])
    dout = torch.randn_like(out)
    want = torch.autograd.grad(out, (qs, k, v), dout)
    delta = (dout * out).sum(-1)
    got_q = torch.zeros_like(qs)
    got_k, got_v = torch.zeros_like(k), torch.zeros_like(v)
    for rows, offset in ((slice(0, 6), None), (slice(6, 12), 0)):
        dq, dk, dv = ba.block_attention_backward(qs, k[rows], v[rows], dout, lse, delta, offset)
        got_q += dq
        got_k[rows] += dk
        got_v[rows] += dv
    for name, a, b in zip("qkv", (got_q, got_k, got_v), want):
        assert (a - b.float()).abs().max() <= TOLERANCE, f"d{name} differs"


@pytest.mark.parametrize("algo", ["ring", "allgather"])
@pytest.mark.parametrize("doc_window", [(False, None), (True, 4)])
@pytest.mark.parametrize("ring", [2, 3])
def test_merged_blocks_equal_capped_attention(monkeypatch, ring, doc_window, algo):
    """A cap of 0.6 over scores of about 1: every block caps before its masks and the merge
    (outputs and gradients), and the cap changes the result."""
    with_documents, window = doc_window
    q, k, v = _inputs(2 * ring * 3, 4, 2)
    doc = _documents(q.shape[0]) if with_documents else None
    want = _full(q, k, v, doc, window, cap=0.6)
    got = _simulated(ca.ALGORITHMS[algo], q, k, v, ring, monkeypatch, doc, window, cap=0.6)
    assert not got.isnan().any() and (got - want).abs().max() <= TOLERANCE
    assert (got - _full(q, k, v, doc, window)).abs().max() > 0.05
    grad = torch.randn_like(want)
    expected = torch.autograd.grad(want, (q, k, v), grad)
    for name, a, b in zip("qkv", torch.autograd.grad(got, (q, k, v), grad), expected):
        assert (a - b).abs().max() <= TOLERANCE, f"{algo} R={ring}: d{name} differs"


@pytest.mark.parametrize("window", [None, 2])
def test_explicit_ring_backward_of_capped_scores(window):
    """The explicit forward and backward (_RingAttention) under a cap, within documents: the
    tanh's derivative in block_attention_backward against autograd of capped attention."""
    q, k, v = _inputs(6, 4, 2)
    doc = _documents(6)
    want = _full(q, k, v, doc, window, cap=0.6)
    got = ca.ring_attention(q, k, v, None, 0, 1, doc=doc, window=window, cap=0.6)
    assert (got - want).abs().max() <= TOLERANCE
    grad = torch.randn_like(want)
    expected = torch.autograd.grad(want, (q, k, v), grad)
    for name, a, b in zip("qkv", torch.autograd.grad(got, (q, k, v), grad), expected):
        assert (a - b).abs().max() <= TOLERANCE, f"d{name} differs"
