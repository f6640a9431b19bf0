"""GPT index arithmetic: hand-worked cases, C++ helper vs NumPy reference (bit-identical over
random configurations), blending proportions."""
import numpy as np
import pytest

from tests.support.data import require_helpers
from megatron.config.errors import ConfigError
from megatron.data import index_math as im


def test_split_ranges_round_like_megatron():
    assert im.split_ranges("969,30,1", 1000) == [(0, 969), (969, 999), (999, 1000)]
    # 40.698 -> 41, 1.26 -> 1, 0.042 -> 0
    assert im.split_ranges("969,30,1", 42) == [(0, 41), (41, 42), (42, 42)]
    assert im.split_ranges("1", 10) == [(0, 10), (10, 10), (10, 10)]
    # 5.6 -> 6, 0.7 -> 1, 0.7 -> 1: one too many, taken from every boundary after the first
    assert im.split_ranges("80/10/10", 7) == [(0, 5), (5, 6), (6, 7)]


def test_split_string_errors():
    for bad in ("a,b", "1,2,3,4", "0,0,0", "-1,2"):
        with pytest.raises(ConfigError, match=r"data.split=.*such as 969,30,1"):
            im.parse_split(bad)


def test_num_epochs_counts_the_one_token_overlap():
    # 10 tokens, 4-token samples of 5: 2 samples need 9 tokens (1 epoch), 3 need 13 (2 epochs)
    assert im.num_epochs(10, 4, 2) == 1
    assert im.num_epochs(10, 4, 3) == 2
    assert im.num_epochs(10, 4, 0) == 1


def test_separate_last_epoch_when_little_of_it_is_used():
    # 100 tokens/epoch, seq 9: 11 samples an epoch; 23 samples need 3 epochs, 22 come from the
    # first two, so the last epoch gives 1 sample < 0.8 * 11: kept apart.
    assert im.num_epochs(100, 9, 23) == 3
    assert im.separate_last_epoch(100, 9, 23, 3)
    assert not im.separate_last_epoch(100, 9, 31, 3)  # 9 of 11: mixed in
    assert not im.separate_last_epoch(100, 9, 5, 1)


def test_sample_idx_hand_worked():
    # documents of 3, 5, 2 tokens, twice; samples of 4 + 1 tokens start every 4 tokens:
    # token 4 is doc 1 offset 1, 8 is doc 2 offset 0, 12 is (second) doc 0 offset 2, ...
    sizes, doc_idx = np.array([3, 5, 2], np.int32), np.array([0, 1, 2, 0, 1, 2], np.int32)
    want = [[0, 0], [1, 1], [2, 0], [3, 2], [4, 3]]
    assert im.sample_idx_numpy(sizes, doc_idx, 4, 4).tolist() == want
    assert require_helpers().build_sample_idx_int32(sizes, doc_idx, 4, 4).tolist() == want


def test_sample_idx_empty_documents_and_first_row():
    # doc 0 is empty: row 0 stays (0, 0) as in Megatron; token 3 is doc 1 offset 3, token 6 is
    # doc 2 offset 2.
    sizes, doc_idx = np.array([0, 4, 3], np.int32), np.array([0, 1, 2], np.int32)
    want = [[0, 0], [1, 3], [2, 2]]
    assert im.sample_idx_numpy(sizes, doc_idx, 3, 2).tolist() == want
    assert require_helpers().build_sample_idx_int32(sizes, doc_idx, 3, 2).tolist() == want


def test_sample_idx_refuses_too_few_tokens():
    sizes, doc_idx = np.array([3], np.int32), np.array([0], np.int32)
    with pytest.raises(IndexError):
        im.sample_idx_numpy(sizes, doc_idx, 2, 2)
    with pytest.raises(IndexError):
        require_helpers().build_sample_idx_int32(sizes, doc_idx, 2, 2)


def test_gpt_index_is_a_permutation_over_epochs():
    sizes = np.array([5, 0, 7, 3, 9], np.int32)
    idx = im.build_gpt_index(sizes, np.arange(5), 40, 6, seed=7, impl="numpy")
    assert np.array_equal(np.sort(idx["doc_idx"]), np.repeat(np.arange(5), 11))  # 11 epochs
    n = len(idx["sample_idx"]) - 1
    assert np.array_equal(np.sort(idx["shuffle_idx"]), np.arange(n)) and n >= 40


def _random_case(rng):
    n_docs = int(rng.integers(1, 60))
    sizes = rng.integers(0, rng.choice([3, 50, 2000]), size=n_docs).astype(np.int32)
    sizes[rng.integers(n_docs)] += 1  # at least one token
    first = int(rng.integers(0, n_docs))
    documents = np.arange(first, int(rng.integers(first + 1, n_docs + 1)))
    if sizes[documents].sum() == 0:
        sizes[documents[0]] = 1
    return sizes, documents, int(rng.integers(1, 1500)), int(rng.choice([1, 7, 64, 513])), \
        int(rng.integers(0, 2 ** 32))


def test_cpp_and_numpy_indices_identical_over_random_configurations():
    require_helpers()
    rng = np.random.default_rng(2024)
    for case in range(200):
        sizes, documents, num_samples, seq, seed = _random_case(rng)
        a = im.build_gpt_index(sizes, documents, num_samples, seq, seed, impl="numpy")
        b = im.build_gpt_index(sizes, documents, num_samples, seq, seed, impl="cpp")
        for key in a:
            assert a[key].dtype == b[key].dtype, (case, key)
            assert np.array_equal(a[key], b[key]), (case, key, sizes, documents, num_samples, seq)


def test_cpp_and_numpy_sample_idx_identical_with_int64_indices():
    helpers = require_helpers()
    rng = np.random.default_rng(5)
    for _ in range(50):
        sizes = rng.integers(0, 40, size=200).astype(np.int32)
        doc_idx = rng.permutation(np.tile(np.arange(200), 3)).astype(np.int64)
        seq = int(rng.integers(1, 100))
        n = (int(sizes[doc_idx].sum()) - 1) // seq
        ref = im.sample_idx_numpy(sizes, doc_idx, seq, n)
        assert ref.dtype == np.int64
        assert np.array_equal(ref, helpers.build_sample_idx_int64(sizes, doc_idx, seq, n))


def test_cpp_and_numpy_blending_identical():
    helpers = require_helpers()
    rng = np.random.default_rng(11)
    for _ in range(40):
        w = rng.random(int(rng.integers(1, 8))) + 1e-3
        w = w / w.sum()
        size = int(rng.integers(0, 5000))
        ref = im.blending_numpy(w, size)
        got = helpers.build_blending_indices(w, size)
        assert np.array_equal(ref[0], got[0]) and np.array_equal(ref[1], got[1])


@pytest.mark.parametrize("weights", [[0.5, 0.5], [0.7, 0.2, 0.1], [0.01, 0.99],
                                     [0.3, 0.3, 0.2, 0.1, 0.1]])
def test_blending_proportions_within_one_percent(weights):
    size = 20000
    which, within = im.blending_builder("cpp")(weights, size)
    counts = np.bincount(which, minlength=len(weights))
    assert np.all(np.abs(counts / size - np.array(weights)) < 0.01)
    # every prefix too: the greedy blend never drifts more than ~one sample per dataset
    for n in (100, 1000, 7777):
        c = np.bincount(which[:n], minlength=len(weights))
        assert np.all(np.abs(c - n * np.array(weights)) <= 1.0 + 1e-9)
    # within-dataset indices count up 0, 1, 2, ... for each dataset
    for d in range(len(weights)):
        assert np.array_equal(within[which == d], np.arange(counts[d]))


def test_explicit_cpp_without_the_helper_is_a_config_error(monkeypatch):
    monkeypatch.setattr(im, "_cpp_helpers", lambda: (None, "No module named _helpers"))
    with pytest.raises(ConfigError, match=r"data.index_impl='cpp'.*make setup"):
        im.resolve_impl("cpp")
    assert im.resolve_impl("auto") == "numpy"
