"""Experts on a global expert axis in the checkpoint (docs/moe.md): a rank holds experts
[first, first + local) of a stacked expert parameter [E_local, ...], split over the expert-
parallel ranks; the checkpoint stores it under its global shape [E, ...], each rank's pieces at
their place in the global tensor. Because the experts are stacked along dim 0, a rank's flat
elements are one contiguous range of the global flat tensor, starting at first x (elements
of one expert): an element range addresses them as it addresses any parameter, and a run
continues at another expert-parallel size (or on one process, or merged to a single file) by
reading its own experts' range. Tensor parallelism of experts (etp) is 1 in this slice: under
tensor parallelism the TP ranks hold other experts, each whole."""
from __future__ import annotations

import math
from typing import Any, Dict

from megatron.checkpoint.state import LocalParam
from megatron.config.errors import InputError


def offset(p: LocalParam) -> int:
    """Where this rank's experts start in the global flat tensor."""
    return p.experts.first * math.prod(p.shape[1:])


def to_global(entry: Dict[str, Any], p: LocalParam) -> Dict[str, Any]:
    """A rank's index entry of an expert parameter (sharded._describe) on the global axis: the
    global shape, the pieces at global element ranges, and the number of experts."""
    base = offset(p)
    entry["shape"] = [p.experts.num_experts, *p.shape[1:]]
    entry["experts"] = p.experts.num_experts
    # Experts are not split over TP (etp = 1): every piece is of the one global tensor, which
    # the index keeps under TP rank 0 whichever TP rank holds it.
    entry["pieces"] = [[rel, 0, start + base, n] for rel, _, start, n in entry["pieces"]]
    return entry


def load_param(reader, p: LocalParam) -> None:
    """Fills this rank's experts of `p` (the whole local tensor where it is held, and its
    master and moment fragments) from the global tensor of `reader`'s checkpoint."""
    e = reader.entry(p.name)
    want = [p.experts.num_experts, *p.shape[1:]]
    if list(e["shape"]) != want:
        raise InputError(f"checkpoint {reader.folder}: {p.name} holds experts of shape "
                         f"{tuple(e['shape'])}, this model {tuple(want)}; it was written for "
                         "another model")
    base = offset(p)
    if p.full is not None:
        master = reader.old_shard(p.name, "master", 0, (base, p.full.numel()))
        p.full.copy_(master.view(p.full.shape).to(p.full.dtype))
    for f in p.fragments:
        for key, dest in (("master", f.master), *f.moments.items()):
            dest.copy_(reader.old_shard(p.name, key, 0, (base + f.start, f.numel)))
        if f.weight is not None:
            f.weight.copy_(f.master.to(f.weight.dtype))
