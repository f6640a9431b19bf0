"""The model-variant registry: each norm, activation (MLP), position scheme and attention core
is one record, registered under the name a config selects it by, that declares the facts the
rest of the framework reads (torch-free: the config, the planner and the checkpoint checks use
them without building a model).

    kind        config field                    the record declares
    norm        model.normalization             its weights
    activation  model.activation                fc1's width in ffn units, the tensors it keeps
    position    model.position_embedding_type   its table (learned) or that it rotates q and k
    attention   model.attention_backend         whether it keeps the s x s scores, its weights,
                                                 whether it can run on a device ("auto" picks)

A record's `module` is the torch side: a class, or "package.module:Name" resolved when a model
is built (so importing this file never imports torch). Each weight a variant owns is a `Weight`
with its full shape as a function of the model section and the dimension it is split over TP;
the planner counts them, checkpoints check them by name, the Hugging Face converters map them by
`hf` names. Nothing else branches on a variant's name: a new variant is one registration
(megatron/config/builtin_variants.py holds the built-in ones; a user's may live anywhere)."""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from megatron.config import plugins
from megatron.config.errors import ConfigError

KIND_FIELD = {"norm": "normalization", "activation": "activation",
              "position": "position_embedding_type", "attention": "attention_backend"}
# model.attention_backend's value that is not a core: pick the first available core in
# registration order (builtin_variants registers flash before sdpa).
AUTO = "auto"


@dataclass(frozen=True)
class Weight:
    """One tensor a variant owns, named relative to its module (e.g. "weight")."""
    name: str
    shape: Callable[[Any], Tuple[int, ...]]  # the model section -> full (unsharded) shape
    tp_dim: Optional[int] = None  # the dimension split over TP ranks; None: replicated

    def full(self, m) -> Tuple[int, ...]:
        return tuple(int(d) for d in self.shape(m))

    def numel(self, m, tp: int = 1) -> int:
        return math.prod(self.full(m)) // (tp if self.tp_dim is not None else 1)


@dataclass(frozen=True)
class Variant:
    kind: str  # a key of KIND_FIELD
    name: str  # the config value that selects it
    module: Any  # the torch module class, or "package.module:Name"
    weights: Tuple[Weight, ...] = ()
    # Hugging Face names per architecture ("gpt2", "llama"): our weight name -> theirs (relative
    # to the same module). An architecture missing here cannot hold the variant.
    hf: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # activation: fc1's output width in units of ffn_hidden_size (SwiGLU's [gate; up] is 2), and
    # the default ffn_hidden_size for a hidden size
    fc1_factor: int = 1
    default_ffn: Optional[Callable[[int], int]] = None
    # position: whether the layer's q and k are rotated (the table, if any, is in `weights`)
    rotates_qk: bool = False
    # attention: keeps the s x s scores for backward (the math path), or only their
    # log-sum-exp (flash-style); forward FLOPs per token beyond the projections
    keeps_scores: bool = False
    # attention: whether its forward takes documents=, a [b, s] document index of the whole
    # sequence, and attends within documents only (data.reset_attention_mask)
    documents: bool = False
    # attention: whether it attends within model.attention.sliding_window (its module reads
    # m.attention.window_of(layer_number))
    sliding_window: bool = False
    # attention: whether it caps its scores by model.attention.logit_softcapping (its module
    # reads it)
    softcapping: bool = False
    flops_per_token: Optional[Callable[[Any], float]] = None
    # attention: whether it can run here, called (device type, precision) by the model where
    # `auto` chooses and where the core is asked for; a callable or "package.module:Name" (it
    # may import torch). None: always.
    available: Any = None
    needs: str = ""  # what `available` checks, for the message when it says no

    def weight_params(self, m, tp: int = 1) -> int:
        """Elements of this variant's weights held by one of tp ranks."""
        return sum(w.numel(m, tp) for w in self.weights)

    def can_run(self, device_type: str, precision: str) -> bool:
        return self.available is None or bool(resolve(self.available)(device_type, precision))

    def build(self, *args, **kwargs):
        """The torch module (imports the implementation on first use)."""
        return resolve(self.module)(*args, **kwargs)


_REGISTRY: Dict[str, Dict[str, Variant]] = {kind: {} for kind in KIND_FIELD}


def register(variant: Variant, replace: bool = False) -> Variant:
    """Adds a variant; the same name twice is an error unless it is the same record or
    `replace` (a test redefining one)."""
    if variant.kind not in _REGISTRY:
        raise ValueError(f"variant kind {variant.kind!r}: expected one of {', '.join(KIND_FIELD)}")
    known = _REGISTRY[variant.kind].get(variant.name)
    if known is not None and known != variant and not replace:
        raise ValueError(f"a {variant.kind} variant named {variant.name!r} is already registered")
    if variant.kind == "attention" and variant.name == AUTO:
        raise ValueError(f"{AUTO!r} is model.attention_backend's automatic choice, not a core")
    _REGISTRY[variant.kind][variant.name] = variant
    return variant


def unregister(kind: str, name: str) -> None:
    _REGISTRY[kind].pop(name, None)


def names(kind: str) -> Tuple[str, ...]:
    return tuple(_REGISTRY[kind])


def choices(kind: str) -> Tuple[str, ...]:
    """The values model.<field> accepts for a kind ("auto" first for attention)."""
    return ((AUTO,) if kind == "attention" else ()) + names(kind)


def get(kind: str, name: str) -> Variant:
    try:
        return _REGISTRY[kind][name]
    except KeyError:
        key = f"model.{KIND_FIELD[kind]}"
        raise ConfigError(key, name, f"one of {', '.join(choices(kind))}",
                          plugins.registry_fix(key)) from None


def of(m, kind: str) -> Variant:
    """The variant a model section selects for a kind (attention: not for "auto", which the
    model resolves on its device: use attention_of)."""
    return get(kind, getattr(m, KIND_FIELD[kind]))


def attention_of(m, resolved: Optional[str] = None) -> Variant:
    """The attention core: the resolved backend, or the configured one. Without a device,
    "auto" is priced as the first core that keeps no scores (what a GPU would pick)."""
    name = resolved or m.attention_backend
    if name == AUTO:
        name = attention_core(keeps_scores=False).name
    return get("attention", name)


def of_architecture(arch: str) -> Dict[str, str]:
    """The model fields a Hugging Face architecture ("gpt2", "llama") fixes: for each kind but
    attention (a choice of kernel, not of function), the one registered variant whose `hf` holds
    the architecture. The converters and the planner's GPT-2-shaped defaults read this, so
    which norm, MLP and positions an architecture has is said once, by the records."""
    out = {}
    for kind, field_name in KIND_FIELD.items():
        if kind == "attention":
            continue
        held = [v.name for v in _REGISTRY[kind].values() if arch in v.hf]
        if len(held) != 1:
            raise ValueError(f"architecture {arch!r}: {len(held)} {kind} variants hold it "
                             f"({', '.join(held) or 'none'}); expected exactly one")
        out[field_name] = held[0]
    return out


def attention_core(keeps_scores: bool) -> Variant:
    """The first registered attention core that keeps the s x s scores for backward (the math
    path), or that keeps only their log-sum-exp: what a layout priced with or without flash
    attention runs as."""
    for v in _REGISTRY["attention"].values():
        if v.keeps_scores == keeps_scores:
            return v
    raise ValueError(f"no registered attention core {'keeps' if keeps_scores else 'drops'} "
                     f"the scores")


def resolve(module: Any):
    """A class, or the object a "package.module:Name" string names."""
    if not isinstance(module, str):
        return module
    path, _, attr = module.partition(":")
    return getattr(importlib.import_module(path), attr)
