"""The language-model loss: per-token cross-entropy of the output head's logits, in fp32.

The logits are the largest tensor of a small model's step ([s, b, V]: 8 x 256 x 8192 fp32 is
64 MiB in issue 15's shape), so the TP=1 paths here keep the passes over them and the fresh
tensors of their size few:
- token_losses: torch's fused log-softmax (one kernel forward, two in-place passes backward)
  instead of the vocabulary-parallel form (seven passes and three new [s, b, V] tensors), which
  TP>1 still needs for its all-reduces;
- head_loss: the output projection and the loss in one autograd function that writes the logits,
  and then their log-softmax, into one buffer kept from step to step. On a CPU a fresh 64 MiB
  tensor is new pages from the kernel, whose faults cost as much as the log-softmax itself.
All compute the vocabulary-parallel loss's math: loss_t = log(sum_v exp(z_v)) - z_t."""
from __future__ import annotations

from typing import Optional

import torch

from megatron.parallel.cross_entropy import vocab_parallel_cross_entropy
from megatron.parallel.state import ParallelState


class _CrossEntropy(torch.autograd.Function):
    """logits [..., V] (any float dtype), target [...] -> loss [...] fp32."""

    @staticmethod
    def forward(ctx, logits, target):
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        ctx.save_for_backward(log_probs, target)
        return log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1).neg_()

    @staticmethod
    def backward(ctx, grad_loss):
        log_probs, target = ctx.saved_tensors
        return _softmax_minus_onehot(log_probs, target, grad_loss), None


def _softmax_minus_onehot(log_probs, target, grad_loss):
    """d loss_t / d z = softmax(z) - onehot(t), times each token's incoming gradient; in place."""
    grad = log_probs.exp_().mul_(grad_loss.unsqueeze(-1))
    return grad.scatter_add_(-1, target.unsqueeze(-1), grad_loss.neg().unsqueeze(-1))


def token_losses(logits: torch.Tensor, target: torch.Tensor, state: ParallelState) -> torch.Tensor:
    """logits [..., V/t] (this rank's vocabulary slice), target [...] int64 -> loss [...] fp32."""
    if state.tp == 1:
        return _CrossEntropy.apply(logits, target)
    return vocab_parallel_cross_entropy(logits, target, state)


class HeadWorkspace:
    """The [s, b, V] buffer of head_loss, lent to one step at a time: taken in the forward,
    given back at the end of the backward. A forward that finds it lent (two micro-batches in
    flight) or of another shape gets a fresh tensor; a step whose backward never runs leaves
    the next one a fresh tensor too."""

    def __init__(self):
        self._free: Optional[torch.Tensor] = None

    def take(self, shape, dtype, device) -> torch.Tensor:
        buf, self._free = self._free, None
        if buf is None or buf.shape != shape or buf.dtype != dtype or buf.device != device:
            buf = torch.empty(shape, dtype=dtype, device=device)
        return buf

    def give(self, buf: torch.Tensor) -> None:
        self._free = buf


_ALIASING_CHECKED = {}


def _log_softmax_in_place_ok(vocab: int) -> bool:
    """Whether this torch's CPU log-softmax gives the same bits written over its own input
    (its last-dim kernel finishes each row's max and sum before writing the row); checked once
    per row length on a small sample, so another torch that breaks it only costs a buffer."""
    if vocab not in _ALIASING_CHECKED:
        x = torch.randn(4, vocab, generator=torch.Generator().manual_seed(0), device="cpu") * 4
        expected = torch.log_softmax(x, dim=-1)
        _ALIASING_CHECKED[vocab] = torch.equal(torch.log_softmax(x, -1, out=x), expected)
    return _ALIASING_CHECKED[vocab]


def fused_head_applies(hidden: torch.Tensor, weight: torch.Tensor, state: ParallelState) -> bool:
    """head_loss covers TP=1 fp32 on the CPU (where fresh pages cost); GPUs have a caching
    allocator, and other dtypes keep the unfused path's exact rounding."""
    return (state.tp == 1 and hidden.device.type == "cpu" and hidden.dtype == torch.float32
            and weight.dtype == torch.float32 and _log_softmax_in_place_ok(weight.shape[0]))


class _HeadLoss(torch.autograd.Function):
    """hidden [s, b, h], weight [V, h], target [s, b] -> loss [s, b]; the same products as
    F.linear and token_losses, in one buffer."""

    @staticmethod
    def forward(ctx, hidden, weight, target, workspace, training):
        flat = hidden.reshape(-1, hidden.shape[-1])
        buf = workspace.take((flat.shape[0], weight.shape[0]), torch.float32, hidden.device)
        torch.mm(flat, weight.t(), out=buf)  # the logits
        torch.log_softmax(buf, dim=-1, out=buf)  # row by row, over itself (checked above)
        loss = buf.gather(-1, target.reshape(-1, 1)).view(target.shape).neg_()
        if training:
            ctx.save_for_backward(hidden, weight, target)
            ctx.buf, ctx.workspace = buf, workspace
        else:  # no backward will come: nothing to keep
            workspace.give(buf)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        hidden, weight, target = ctx.saved_tensors
        grad = _softmax_minus_onehot(ctx.buf, target.reshape(-1), grad_loss.reshape(-1))
        flat = hidden.reshape(-1, hidden.shape[-1])
        d_hidden = torch.mm(grad, weight).view(hidden.shape) if ctx.needs_input_grad[0] else None
        d_weight = torch.mm(grad.t(), flat) if ctx.needs_input_grad[1] else None
        ctx.workspace.give(ctx.buf)
        ctx.buf = None
        return d_hidden, d_weight, None, None, None


def head_loss(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
              workspace: HeadWorkspace) -> torch.Tensor:
    """Per-token loss of the output head (logits = hidden @ weight^T, no bias) when
    fused_head_applies; target [s, b] int64."""
    # Decided here: inside forward, grad mode is always off.
    training = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return _HeadLoss.apply(hidden, weight, target, workspace, training)
