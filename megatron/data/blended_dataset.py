"""Weighted blending of several datasets, and the parsing of data.paths."""
from __future__ import annotations

import os
from typing import List, Sequence, Tuple

import numpy as np

from megatron.config.errors import ConfigError
from megatron.data.index_cache import key_digest, load_or_build
from megatron.data.index_math import blending_builder


def parse_paths(paths: Sequence[str]) -> Tuple[List[float], List[str]]:
    """data.paths entries "WEIGHT PREFIX" or "PREFIX" -> (weights summing to 1, prefixes).
    Plain prefixes weigh equally; mixing the two forms is an error (the intent is unclear)."""
    weights, prefixes = [], []
    for entry in paths:
        parts = str(entry).split(None, 1)
        weight = None
        if len(parts) == 2:
            try:
                weight = float(parts[0])
            except ValueError:
                weight = None
        if weight is None:
            _refuse_a_lone_weight(entry, paths)
            prefixes.append(str(entry).strip())
        else:
            if weight <= 0:
                raise ConfigError("data.paths", entry, "a positive weight before the prefix")
            prefixes.append(parts[1].strip())
        weights.append(weight)
    if any(w is None for w in weights) and any(w is not None for w in weights):
        raise ConfigError("data.paths", list(paths), "either every entry \"WEIGHT PREFIX\" or "
                          "every entry a plain PREFIX (equal weights)")
    if weights and weights[0] is None:
        weights = [1.0] * len(prefixes)
    total = sum(weights)
    return [w / total for w in weights], prefixes


def _refuse_a_lone_weight(entry, paths: Sequence[str]) -> None:
    """An entry that is a number alone is Megatron-LM's --data-path habit (weight and prefix as
    separate items), which read as a prefix named "0.3" would fail on a missing 0.3.idx."""
    try:
        float(str(entry).strip())
    except ValueError:
        return
    items = [str(p).strip() for p in paths]
    pairs = [f"{w} {p}" for w, p in zip(items[::2], items[1::2])]
    raise ConfigError("data.paths", entry, "a dataset prefix, or a weight and its prefix in one "
                      "entry (\"WEIGHT PREFIX\"); a number alone is a weight without its prefix",
                      f"write each pair as one entry, e.g. data.paths={pairs or ['0.5 PREFIX']} "
                      "(a prefix named like a number: write it as ./NAME)")


def blend_indices(weights: Sequence[float], size: int, cache_dir: str,
                  impl: str = "auto") -> Tuple[np.ndarray, np.ndarray]:
    """(dataset_index, dataset_sample_index) of a blend, cached: a pure function of the
    weights and the size."""
    weights = [float(w) for w in weights]
    name = "blend_{}_{}ns_{}".format(len(weights), int(size),
                                     key_digest({"weights": weights, "size": int(size)}))
    names = ("dataset_index", "dataset_sample_index")
    arrays = load_or_build(cache_dir, name, names,
                           lambda: dict(zip(names, blending_builder(impl)(weights, int(size)))))
    return arrays["dataset_index"], arrays["dataset_sample_index"]


def samples_per_dataset(dataset_index: np.ndarray, num_datasets: int) -> List[int]:
    """How many samples of each dataset a blend draws."""
    return np.bincount(np.asarray(dataset_index, np.int64), minlength=num_datasets).tolist()


class BlendedDataset:
    """Sample i comes from dataset dataset_index[i], as its dataset_sample_index[i]-th sample.
    The greedy blend keeps every prefix of the stream within about one sample of the weights."""

    def __init__(self, datasets: Sequence, dataset_index: np.ndarray,
                 dataset_sample_index: np.ndarray):
        self.datasets = list(datasets)
        self.dataset_index = dataset_index
        self.dataset_sample_index = dataset_sample_index

    def __len__(self) -> int:
        return len(self.dataset_index)

    def __getitem__(self, i: int) -> np.ndarray:
        d = int(self.dataset_index[i])
        return self.datasets[d][int(self.dataset_sample_index[i])]


def default_cache_dir(prefix: str) -> str:
    """Next to the data, as Megatron does."""
    return os.path.dirname(os.path.abspath(prefix))
