"""Dropout randomness that is identical where activations are replicated across tensor-parallel
ranks and different where they are sharded.

The default generator is seeded identically on every TP rank (replicated activations: hidden
dropout without sequence parallelism). The tracker's "tp" stream is seeded per TP rank (sharded
activations: attention heads, sequence-parallel shards). Forking swaps the device generator's
state, as Megatron does, so torch's own dropout kernels can be used unchanged."""
from __future__ import annotations

import contextlib
import zlib
from typing import Dict

import torch

# Offset keeping the sharded stream apart from the replicated one (any constant works).
_TP_SEED_OFFSET = 2718


def _get_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_state(state: torch.Tensor, device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def seed_for(base_seed: int, key: str) -> int:
    """A stable seed for one named tensor, the same in every parallel layout."""
    return (base_seed * 1_000_003 + zlib.crc32(key.encode())) % (2 ** 63)


class RNGTracker:
    def __init__(self, device: torch.device = torch.device("cpu")):
        self.device = device
        self.states: Dict[str, torch.Tensor] = {}

    def add(self, name: str, seed: int) -> None:
        saved = _get_state(self.device)
        if self.device.type == "cuda":
            torch.cuda.manual_seed(seed)
        else:
            torch.manual_seed(seed)
        self.states[name] = _get_state(self.device)
        _set_state(saved, self.device)

    @contextlib.contextmanager
    def fork(self, name: str = "tp"):
        saved = _get_state(self.device)
        _set_state(self.states[name], self.device)
        try:
            yield
        finally:
            self.states[name] = _get_state(self.device)
            _set_state(saved, self.device)

    def snapshot(self):
        return _get_state(self.device), {k: v.clone() for k, v in self.states.items()}

    def restore(self, snap) -> None:
        default, states = snap
        _set_state(default, self.device)
        self.states = {k: v.clone() for k, v in states.items()}


def build_tracker(seed: int, tp_rank: int, pp_rank: int, device: torch.device) -> RNGTracker:
    """Seeds the default generator (same on all TP ranks, distinct per pipeline stage) and the
    tracker's sharded stream (distinct per TP rank)."""
    tracker = RNGTracker(device)
    reseed(tracker, seed, tp_rank, pp_rank)
    return tracker


def reseed(tracker: RNGTracker, seed: int, tp_rank: int, pp_rank: int) -> None:
    """Seeds the default generator and the tracker's streams as build_tracker does (also used
    when a run continues in another TP or PP layout, whose streams cannot carry over)."""
    stage_seed = seed + 100 * pp_rank
    torch.manual_seed(stage_seed)
    if tracker.device.type == "cuda":
        torch.cuda.manual_seed(stage_seed)
    tracker.add("tp", stage_seed + _TP_SEED_OFFSET + tp_rank)


def dropout(x: torch.Tensor, p: float, training: bool, sharded: bool,
            tracker: "RNGTracker | None") -> torch.Tensor:
    if p == 0.0 or not training:
        return x
    if sharded and tracker is not None:
        with tracker.fork("tp"):
            return torch.nn.functional.dropout(x, p, True)
    return torch.nn.functional.dropout(x, p, True)
