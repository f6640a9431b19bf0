"""Shared pieces of the tensor-parallel checks (tp_layers_worker.py, tp_checks_state.py): seeded
inputs, the mismatch report, and small helpers for slices and gathers."""
from __future__ import annotations

from typing import List

import torch
import torch.distributed as dist
import torch.nn.functional as F

from megatron.parallel.state import ParallelState

ATOL = RTOL = 1e-6
S, B, IN, OUT, VOCAB = 8, 2, 16, 24, 32  # s divisible by 4; OUT by 4 x stride 2


def randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


class Report:
    """Collects mismatches instead of raising, so every rank reaches every collective."""

    def __init__(self):
        self.errors: List[str] = []

    def close(self, label: str, got, want, atol: float = ATOL, rtol: float = RTOL) -> None:
        if got is None or want is None:
            self.errors.append(f"{label}: gradient missing (got {got is not None}, "
                               f"want {want is not None})")
            return
        got, want = got.detach(), want.detach()
        if got.shape != want.shape:
            self.errors.append(f"{label}: shape {tuple(got.shape)} != {tuple(want.shape)}")
            return
        err = (got - want).abs()
        if not bool((err <= atol + rtol * want.abs()).all()):
            self.errors.append(f"{label}: max abs error {err.max().item():.3g}")

    def true(self, label: str, cond: bool) -> None:
        if not cond:
            self.errors.append(label)

    def raise_if_failed(self) -> None:
        if self.errors:
            raise AssertionError("; ".join(self.errors))


def leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(True)


def ref_linear(x, w, b, grad):
    """Unsharded y = x w^T + b and its gradients for upstream gradient `grad`."""
    x, w = leaf(x), leaf(w)
    b = leaf(b) if b is not None else None
    y = F.linear(x, w, b)
    y.backward(grad)
    return y.detach(), x.grad, w.grad, (b.grad if b is not None else None)


def seq_chunk(t: torch.Tensor, st: ParallelState) -> torch.Tensor:
    return t.chunk(st.tp, dim=0)[st.tp_rank]


def gather_group(t: torch.Tensor, group) -> List[torch.Tensor]:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return parts


# ---------------------------------------------------------------------------------- layers
