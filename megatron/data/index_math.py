"""The index arithmetic of Megatron's GPT dataset, and NumPy references for the C++ helper.

For a set of documents, a sample count and a sequence length:
  doc_idx     the documents repeated over enough epochs, shuffled (once per epoch group);
  sample_idx  row s = (position in doc_idx, token offset) where sample s starts; a sample is
              seq_length + 1 tokens and the next sample starts on its last token;
  shuffle_idx a permutation of the samples.
Shuffles use numpy's RandomState(seed) in one fixed order, as Megatron does, so the indices are
a pure function of (document sizes, documents, num_samples, seq_length, seed).

`data.index_impl` picks who builds sample_idx and the blending index: the C++ helper
(megatron.data._helpers, compiled ahead of time) or the functions here; both give identical
arrays."""
from __future__ import annotations

import functools
import logging
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np

from megatron.config.errors import ConfigError
from megatron.config.sections import split_fractions

log = logging.getLogger(__name__)

_INT32_LIMIT = 2 ** 31 - 1
# Megatron keeps the last epoch apart when less than this share of it is needed: shuffled
# together, the used samples would draw unevenly from a partly consumed epoch; apart, every full
# epoch is consumed before any sample of the last one.
_LAST_EPOCH_SHARE = 0.80


# ---- train/valid/test split ---------------------------------------------------------------------

def parse_split(text: str) -> List[float]:
    """'969,30,1' (or '90/5/5', or '1') -> three fractions summing to 1."""
    return split_fractions(text)


def split_ranges(text: str, num_documents: int) -> List[Tuple[int, int]]:
    """Ranges [start, stop) of train, valid and test over num_documents items (for GPT data,
    sequences, as Megatron takes them), as Megatron rounds them: each boundary is rounded, and any rounding excess is taken from all boundaries but the first."""
    bounds = [0]
    for fraction in parse_split(text):
        bounds.append(bounds[-1] + int(round(fraction * float(num_documents))))
    excess = bounds[-1] - num_documents
    bounds = [bounds[0]] + [b - excess for b in bounds[1:]]
    return [(bounds[i], bounds[i + 1]) for i in range(3)]


# ---- epochs, document order, shuffle -------------------------------------------------------

def num_epochs(tokens_per_epoch: int, seq_length: int, num_samples: int) -> int:
    """The fewest epochs whose tokens make num_samples samples: samples overlap by one token, so
    E epochs give (E * tokens - 1) // seq_length of them."""
    return max(1, -(-(num_samples * seq_length + 1) // tokens_per_epoch))


def separate_last_epoch(tokens_per_epoch: int, seq_length: int, num_samples: int,
                        epochs: int) -> bool:
    if epochs == 1:
        return False
    before_last = ((epochs - 1) * tokens_per_epoch - 1) // seq_length
    per_epoch = (tokens_per_epoch - 1) // seq_length
    return num_samples - before_last < int(_LAST_EPOCH_SHARE * per_epoch)


def index_dtype(num_entries: int):
    return np.int32 if num_entries <= _INT32_LIMIT else np.int64


def build_doc_idx(documents: np.ndarray, epochs: int, rng: np.random.RandomState,
                  separate_last: bool) -> np.ndarray:
    if separate_last and epochs > 1:
        first = build_doc_idx(documents, epochs - 1, rng, False)
        last = build_doc_idx(documents, 1, rng, False)
        return np.concatenate((first, last.astype(first.dtype)))
    dtype = index_dtype(max(len(documents) * epochs, int(documents.max(initial=0)) + 1))
    doc_idx = np.tile(np.asarray(documents, dtype=dtype), epochs)
    rng.shuffle(doc_idx)
    return doc_idx


def build_shuffle_idx(num_samples: int, total: int, rng: np.random.RandomState) -> np.ndarray:
    """A permutation of [0, num_samples) followed by one of [num_samples, total)."""
    dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total:
        return first
    last = np.arange(num_samples, total, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


# ---- NumPy references of the C++ helper ----------------------------------------------------

def sample_idx_numpy(sizes: np.ndarray, doc_idx: np.ndarray, seq_length: int,
                     num_samples: int) -> np.ndarray:
    """Sample s starts at token s * seq_length of the concatenated documents; the document that
    holds it is the first whose end lies beyond it (empty documents hold nothing)."""
    lengths = np.asarray(sizes)[doc_idx].astype(np.int64)
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    if num_samples * seq_length + 1 > total:
        raise IndexError("the documents hold fewer tokens than num_samples needs")
    starts = np.arange(num_samples + 1, dtype=np.int64) * seq_length
    where = np.searchsorted(ends, starts, side="right")
    out = np.empty((num_samples + 1, 2), dtype=doc_idx.dtype)
    out[:, 0] = where
    out[:, 1] = starts - (ends[where] - lengths[where])
    out[0] = (0, 0)  # Megatron's first row, even when doc_idx[0] is an empty document
    return out


def blending_numpy(weights: Sequence[float], size: int) -> Tuple[np.ndarray, np.ndarray]:
    """Greedy blending: sample s goes to argmax_d(w[d] * max(s, 1) - taken[d]), lowest d on
    ties. Plain Python floats round exactly as the C++ doubles do."""
    w = [float(x) for x in weights]
    taken = [0] * len(w)
    which, within = [0] * size, [0] * size
    for s in range(size):
        scale = max(float(s), 1.0)
        best, best_error = 0, w[0] * scale - taken[0]
        for d in range(1, len(w)):
            error = w[d] * scale - taken[d]
            if error > best_error:
                best, best_error = d, error
        which[s], within[s] = best, taken[best]
        taken[best] += 1
    return np.asarray(which, dtype=np.int16), np.asarray(within, dtype=np.int64)


# ---- implementation choice --------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _cpp_helpers():
    try:
        from megatron.data import _helpers
    except ImportError as e:
        return None, str(e)
    return _helpers, ""


def resolve_impl(name: str) -> str:
    """'auto' -> 'cpp' when the helper is built, else 'numpy' (logged once)."""
    helpers, why = _cpp_helpers()
    if name == "cpp" and helpers is None:
        raise ConfigError("data.index_impl", name, "a built C++ helper (megatron.data._helpers: "
                          f"{why})", "build it with `make setup` (pip install "
                          "--no-build-isolation -e .) or set data.index_impl=numpy")
    if name == "auto":
        if helpers is None:
            _log_fallback(why)
            return "numpy"
        return "cpp"
    return name


@functools.lru_cache(maxsize=1)
def _log_fallback(why: str) -> None:
    log.warning("data.index_impl=auto: the C++ index helper is not built (%s); using the NumPy "
                "implementation (identical indices, slower blending)", why)


def sample_idx_builder(impl: str) -> Callable[..., np.ndarray]:
    if resolve_impl(impl) == "numpy":
        return sample_idx_numpy
    helpers = _cpp_helpers()[0]

    def build(sizes, doc_idx, seq_length, num_samples):
        fn = (helpers.build_sample_idx_int32 if doc_idx.dtype == np.int32
              else helpers.build_sample_idx_int64)
        return fn(np.asarray(sizes, np.int32), doc_idx, seq_length, num_samples)
    return build


def blending_builder(impl: str) -> Callable[..., Tuple[np.ndarray, np.ndarray]]:
    if resolve_impl(impl) == "numpy":
        return blending_numpy
    helpers = _cpp_helpers()[0]
    return lambda weights, size: tuple(helpers.build_blending_indices(
        np.asarray(weights, np.float64), int(size)))


# ---- the whole GPT index ----------------------------------------------------------------

def build_gpt_index(sizes: np.ndarray, documents: np.ndarray, num_samples: int, seq_length: int,
                    seed: int, impl: str = "auto") -> Dict[str, np.ndarray]:
    """doc_idx, sample_idx and shuffle_idx for at least num_samples samples."""
    documents = np.asarray(documents, dtype=np.int64)
    tokens = int(np.asarray(sizes)[documents].sum(dtype=np.int64))
    if tokens == 0:
        raise ValueError("the documents hold no tokens")
    epochs = num_epochs(tokens, seq_length, num_samples)
    separate = separate_last_epoch(tokens, seq_length, num_samples, epochs)
    rng = np.random.RandomState(seed)
    doc_idx = build_doc_idx(documents, epochs, rng, separate)
    all_samples = (epochs * tokens - 1) // seq_length
    sample_idx = sample_idx_builder(impl)(sizes, doc_idx, seq_length, all_samples)
    first = ((epochs - 1) * tokens - 1) // seq_length if separate else all_samples
    shuffle_idx = build_shuffle_idx(first, all_samples, rng)
    log.debug("GPT index: %d tokens/epoch, %d epochs (last separate: %s), %d samples",
              tokens, epochs, separate, all_samples)
    return {"doc_idx": doc_idx, "sample_idx": sample_idx, "shuffle_idx": shuffle_idx}
