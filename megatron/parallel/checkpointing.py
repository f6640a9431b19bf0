"""Activation recomputation that replays the exact dropout masks.

torch.utils.checkpoint restores the default generator only; our tracker's sharded stream must be
restored too or the recomputed masks differ from the forward ones and the gradients are wrong."""
from __future__ import annotations

from typing import Callable

import torch

from megatron.parallel.random import RNGTracker


class _Recompute(torch.autograd.Function):
    """Forward: run fn without storing activations. Backward: rerun fn with the forward's random
    states, then backpropagate through the rerun."""

    @staticmethod
    def forward(ctx, fn, tracker, x):
        ctx.fn, ctx.tracker = fn, tracker
        ctx.snap = tracker.snapshot() if tracker is not None else None
        ctx.save_for_backward(x)
        with torch.no_grad():
            return fn(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_(True)
        now = ctx.tracker.snapshot() if ctx.tracker is not None else None
        if ctx.snap is not None:
            ctx.tracker.restore(ctx.snap)
        with torch.enable_grad():
            out = ctx.fn(x)
        if now is not None:
            ctx.tracker.restore(now)
        torch.autograd.backward(out, grad)
        return None, None, x.grad


def recompute(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
              tracker: "RNGTracker | None") -> torch.Tensor:
    return _Recompute.apply(fn, tracker, x)
