"""Fused ops as records: one FusedOp per op, registered by the file that defines it.

A record holds everything the rest of the package needs to know about an op: its torch
reference, its fused callable (an autograd Function over an extension module), the calls its
kernel accepts, and the catalog's facts (which extension module provides it, from which
sources). Dispatch (ops.dispatch), the selection, the loader and the report read records and
never branch on an op's name, so a new op is a catalog line, one file in builtin/ and its csrc.

The catalog stays the one list of what is compiled (tools/kernel_build.py reads it by path,
without torch); a record takes its module and sources from it, so they are written once. An
op that no extension module provides (not in the catalog) is reference-only: it is listed and
dispatched like the others and never runs fused."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from megatron.kernels.catalog import MODULE_OF, MODULES, OPS


@dataclass(frozen=True)
class FusedOp:
    name: str
    # Pure PyTorch, math in fp32, result in the input dtype: the specification of the op.
    reference: Callable
    # The fused path, called with the reference's arguments; None for a reference-only op.
    fused: Optional[Callable] = None
    # Whether a call (the reference's arguments) fits the kernel's contract; others go to the
    # reference, so selecting the fused path never changes what a caller may pass.
    accepts: Optional[Callable[..., bool]] = None
    # The path when the fused one is not taken, where it is not the reference itself (the
    # norms use torch's own kernels on a GPU); it decides per call and may call the reference.
    unfused: Optional[Callable] = None
    module: Optional[str] = None       # the extension module (catalog.MODULES)
    sources: Tuple[str, ...] = ()      # its translation units, relative to csrc/


# Name -> record, in registration order.
_RECORDS: Dict[str, FusedOp] = {}


def register(name: str, reference: Callable, fused: Optional[Callable] = None,
             accepts: Optional[Callable[..., bool]] = None,
             unfused: Optional[Callable] = None) -> FusedOp:
    """Records op `name`; its module and sources come from the catalog when it lists the op."""
    if name in _RECORDS:
        raise ValueError(f"fused op {name!r} is registered twice")
    module = MODULE_OF.get(name)
    if module is None and fused is not None:
        raise ValueError(f"fused op {name!r} has a fused path but no extension module builds it; "
                         f"add its module, sources and ops to megatron/kernels/catalog.py")
    if module is not None and (fused is None or accepts is None):
        raise ValueError(f"fused op {name!r} is compiled into {module} (catalog.py) but its "
                         f"record has no fused path or no accepts predicate")
    record = FusedOp(name, reference, fused, accepts, unfused, module,
                     MODULES[module][0] if module else ())
    _RECORDS[name] = record
    return record


def get(name: str) -> FusedOp:
    try:
        return _RECORDS[name]
    except KeyError:
        raise KeyError(f"unknown fused op {name!r}; known: {', '.join(names())}") from None


def names() -> List[str]:
    """Every registered op: the catalog's in catalog order, then reference-only ones."""
    return [op for op in OPS if op in _RECORDS] + [op for op in _RECORDS if op not in MODULE_OF]


def records() -> List[FusedOp]:
    return [_RECORDS[op] for op in names()]


def check_complete() -> None:
    """Every op the catalog compiles has a record (called once the built-in files are read)."""
    missing = [op for op in OPS if op not in _RECORDS]
    if missing:
        raise RuntimeError(f"catalog.py lists {', '.join(missing)} but no file registers "
                           f"{'it' if len(missing) == 1 else 'them'}; add a FusedOp in "
                           f"megatron/kernels/builtin/ and import it in builtin/__init__.py")
