"""GPT dataset and real-data iterators: sample contents, splits, blending, resumption and
data-parallel slicing, vocabulary checks."""
import numpy as np
import pytest

from tests.support.data import write_tokens
from megatron.config import load_config
from megatron.config.errors import ConfigError, InputError
from megatron.data import build_iterators
from megatron.data.blended_dataset import parse_paths
from megatron.data.gpt_dataset import GPTDataset, build_split
from megatron.data.indexed_dataset import IndexedDataset


def _docs(n, base=0, seed=0):
    """Document i holds tokens base + 1000 * i + j: every token names its document."""
    rng = np.random.default_rng(seed)
    return [[base + 1000 * i + j for j in range(int(rng.integers(1, 60)))] for i in range(n)]


@pytest.fixture
def corpus(tmp_path):
    prefix = str(tmp_path / "c")
    write_tokens(prefix, _docs(40))
    return prefix


def _cfg(tmp_path, paths, **overrides):
    sets = {"data.synthetic": "false", "data.paths": repr(paths).replace("'", '"'),
            "data.cache_dir": str(tmp_path / "cache"), "model.vocab_size": "65536",
            "model.seq_length": "16", "training.micro_batch_size": "2",
            "training.global_batch_size": "8", "training.train_iters": "20",
            "training.eval_iters": "2", **overrides}
    return load_config(None, [f"{k}={v}" for k, v in sets.items()])


def test_samples_are_consecutive_tokens_of_the_shuffled_document_stream(corpus, tmp_path):
    indexed = IndexedDataset(corpus)
    seq = 16
    ds = GPTDataset(indexed, "train", (0, 40), 300, seq, 1234, str(tmp_path / "cache"))
    stream = np.concatenate([indexed.get(int(d)) for d in ds.doc_idx]).astype(np.int64)
    assert len(ds) >= 300
    for i in range(len(ds)):
        s = int(ds.shuffle_idx[i])
        np.testing.assert_array_equal(ds[i], stream[s * seq:s * seq + seq + 1])


def test_a_sequence_range_of_several_sequences_per_document(tmp_path):
    """A split is a range of sequences, as Megatron's GPT dataset takes it (not of documents)."""
    from tests.support.data import spec_write
    prefix = str(tmp_path / "multi")
    spec_write(prefix, 4, [[[1, 2, 3], [4, 5]], [[6]], [[7, 8], [9, 10, 11, 12]]])
    ds = GPTDataset(IndexedDataset(prefix), "train", (1, 3), 3, 2, 0, str(tmp_path / "cache"))
    tokens = {int(t) for i in range(len(ds)) for t in ds[i]}
    assert tokens == {4, 5, 6}  # sequences 1 and 2: the second of document 0, document 1


def test_iterators_shapes_shift_and_vocab(corpus, tmp_path):
    it = build_iterators(_cfg(tmp_path, [corpus]), 0, 1, 0)
    assert it.vocab_size == 65536
    tokens, labels = next(it.train)
    assert tokens.shape == (2, 16) and labels.shape == (2, 16)
    assert str(tokens.dtype) == "torch.int64" and bool((tokens[:, 1:] == labels[:, :-1]).all())


def test_a_known_vocabulary_does_not_load_the_tokenizer_again(corpus, tmp_path, monkeypatch):
    """The trainer already loaded the tokenizer for the model's vocabulary; the iterators take
    that size instead of loading it a second time (seconds for a large BPE file)."""
    import megatron.data.tokenizers as tokenizers
    loads = []
    real = tokenizers.build_tokenizer
    monkeypatch.setattr(tokenizers, "build_tokenizer", lambda spec: loads.append(spec) or real(spec))
    cfg = _cfg(tmp_path, [corpus])
    assert build_iterators(cfg, 0, 1, 0, vocab_size=60000).vocab_size == 60000
    assert loads == []
    assert build_iterators(cfg, 0, 1, 0).vocab_size == 65536 and len(loads) == 1


def _take(iterator, n):
    return [np.concatenate([t.numpy(), l.numpy()[:, -1:]], axis=1) for t, l in
            (next(iterator) for _ in range(n))]


def test_deterministic_and_resumable(corpus, tmp_path):
    cfg = _cfg(tmp_path, [corpus])
    first = _take(build_iterators(cfg, 0, 1, 0).train, 12)
    again = _take(build_iterators(cfg, 0, 1, 0).train, 12)
    resumed = _take(build_iterators(cfg, 0, 1, 16).train, 4)  # 16 samples = 2 steps of 4 mbs
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert all(np.array_equal(a, b) for a, b in zip(first[8:], resumed))


def test_data_parallel_ranks_split_each_global_batch(corpus, tmp_path):
    cfg = _cfg(tmp_path, [corpus])
    whole = np.concatenate(_take(build_iterators(cfg, 0, 1, 0).train, 4))  # one step
    parts = [np.concatenate(_take(build_iterators(cfg, r, 2, 0).train, 2)) for r in (0, 1)]
    union = np.concatenate(parts)
    assert sorted(map(tuple, union.tolist())) == sorted(map(tuple, whole.tolist()))


def test_valid_iterator_uses_valid_documents_and_restarts(corpus, tmp_path):
    cfg = _cfg(tmp_path, [corpus], **{"data.split": "30,10,0"})
    it = build_iterators(cfg, 0, 1, 0)
    a, b = _take(it.valid(), 3), _take(it.valid(), 3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    docs = {int(t) // 1000 for x in a for t in x.ravel()}
    assert docs <= set(range(30, 40))
    train_docs = {int(t) // 1000 for x in _take(it.train, 5) for t in x.ravel()}
    assert train_docs <= set(range(30))


def test_no_valid_split_gives_none(corpus, tmp_path):
    it = build_iterators(_cfg(tmp_path, [corpus], **{"data.split": "1"}), 0, 1, 0)
    assert it.valid is None and it.test is None


def test_test_iterator_uses_only_test_documents(corpus, tmp_path):
    cfg = _cfg(tmp_path, [corpus], **{"data.split": "30,5,5"})
    it = build_iterators(cfg, 0, 1, 0)
    a, b = _take(it.test(), 3), _take(it.test(), 3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert {int(t) // 1000 for x in a for t in x.ravel()} <= set(range(35, 40))
    assert {int(t) // 1000 for x in _take(it.valid(), 3) for t in x.ravel()} <= set(range(30, 35))


def test_blend_follows_the_weights(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_tokens(a, _docs(30, 0, seed=1))
    write_tokens(b, _docs(20, 40000, seed=2))
    weights, prefixes = parse_paths([f"0.7 {a}", f"0.3 {b}"])
    datasets = [IndexedDataset(p) for p in prefixes]
    ds = build_split("train", datasets, weights, "1", 5000, 8, 3, str(tmp_path / "cache"))
    from_b = sum(int(ds[i][0]) >= 40000 for i in range(len(ds)))
    assert abs(from_b / len(ds) - 0.3) < 0.01
    # the iterators blend the same way
    it = build_iterators(_cfg(tmp_path, [f"0.7 {a}", f"0.3 {b}"]), 0, 1, 0)
    assert len(_take(it.train, 3)) == 3


def test_parse_paths():
    assert parse_paths(["x", "y"]) == ([0.5, 0.5], ["x", "y"])
    assert parse_paths(["3 x", "1 /d/my data"]) == ([0.75, 0.25], ["x", "/d/my data"])
    with pytest.raises(ConfigError, match=r"either every entry"):
        parse_paths(["0.5 x", "y"])
    with pytest.raises(ConfigError, match=r"positive weight"):
        parse_paths(["-1 x"])
    # Megatron-LM's --data-path habit, weights and prefixes as separate items: named, with the
    # pairs to write instead (it was a missing "0.3.idx")
    with pytest.raises(ConfigError, match=r"data.paths='0.3' is invalid: .*a number alone is a "
                                          r"weight .*\['0.3 a', '0.7 b'\]"):
        parse_paths(["0.3", "a", "0.7", "b"])
    assert parse_paths(["./2024", "x"]) == ([0.5, 0.5], ["./2024", "x"])


def test_vocabulary_mismatch_fails_at_startup(corpus, tmp_path):
    with pytest.raises(InputError) as e:
        build_iterators(_cfg(tmp_path, [corpus], **{"model.vocab_size": "1000"}), 0, 1, 0)
    assert f"{corpus}.bin holds token id" in str(e.value)
    assert "expected ids below the vocabulary size 1000" in str(e.value)


def test_large_datasets_check_token_ids_sample_by_sample(corpus, tmp_path):
    ds = GPTDataset(IndexedDataset(corpus), "train", (0, 40), 10, 16, 1, str(tmp_path / "c"),
                    vocab_size=1000)
    with pytest.raises(InputError, match=r"c.bin holds token id \d+ \(a sample from sequence"):
        [ds[i] for i in range(len(ds))]


def test_missing_data_and_empty_train_split(corpus, tmp_path):
    with pytest.raises(InputError, match=r"nothere.idx does not exist"):
        build_iterators(_cfg(tmp_path, [str(tmp_path / "nothere")]), 0, 1, 0)
    with pytest.raises(InputError, match=r"data.split='0,1,0' leaves no training sequences"):
        build_iterators(_cfg(tmp_path, [corpus], **{"data.split": "0,1,0"}), 0, 1, 0)


def test_config_checks_split_and_seed(tmp_path):
    with pytest.raises(ConfigError, match=r"data.split='9;1'"):
        _cfg(tmp_path, ["x"], **{"data.split": "9;1"})
    with pytest.raises(ConfigError, match=r"data.seed=-1"):
        _cfg(tmp_path, ["x"], **{"data.seed": "-1"})


def test_eod_mask_loss_ignores_the_labels_predicted_from_an_end_of_document(tmp_path):
    """data.eod_mask_loss: the label after each end-of-document input (the null tokenizer's
    last id) is IGNORED_LABEL; every other label is still the next token."""
    from megatron.data.iterators import IGNORED_LABEL
    prefix = str(tmp_path / "eod")
    write_tokens(prefix, [doc + [65535] for doc in _docs(40)])
    plain = build_iterators(_cfg(tmp_path, [prefix]), 0, 1, 0)
    masked = build_iterators(_cfg(tmp_path, [prefix], **{"data.eod_mask_loss": "true"}), 0, 1, 0)
    seen = 0
    for _ in range(8):
        (tokens, labels), (m_tokens, m_labels) = next(plain.train), next(masked.train)
        assert bytes(tokens.numpy()) == bytes(m_tokens.numpy())
        at_eod = tokens == 65535
        seen += int(at_eod.sum())
        assert bool((m_labels[at_eod] == IGNORED_LABEL).all())
        assert bool((m_labels[~at_eod] == labels[~at_eod]).all())
    assert seen > 0
    (v_tokens, v_labels) = next(masked.valid())  # evaluation counts the same predictions
    assert bool((v_labels[v_tokens == 65535] == IGNORED_LABEL).all())


def test_eod_mask_loss_needs_an_end_of_document_id(corpus, tmp_path, monkeypatch):
    import megatron.data.tokenizers.null as null
    monkeypatch.setattr(null.NullTokenizer, "_eod_id", lambda self: None)
    with pytest.raises(InputError, match=r"data.eod_mask_loss=true reads the end-of-document "
                                         r"id, but .* no end-of-document token"
                                         r".*set data.eod_mask_loss=false"):
        build_iterators(_cfg(tmp_path, [corpus], **{"data.eod_mask_loss": "true"}), 0, 1, 0)
