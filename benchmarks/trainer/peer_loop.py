"""The training loop both peers run: what a PyTorch user writes, from the facts in facts.py.

Per step: fetch a batch, forward with the loss, zero the gradients, backward, clip the global
gradient norm at 1.0, AdamW step with the warm-up + cosine schedule, and read the loss and the
norm as numbers (what a loop logs). Each iteration is timed whole, in wall and process CPU
seconds, like the trainer's RunSummary.iteration_times / iteration_cpu_times."""
from __future__ import annotations

import time
from typing import Callable, Dict

import torch

import facts


def adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    """No weight decay on 1-D parameters (norms, biases), decay on matrices and embeddings."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": facts.WEIGHT_DECAY},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=facts.LR, betas=facts.BETAS, eps=facts.EPS, foreach=True)


def train(model: torch.nn.Module, loss_fn: Callable, shape: facts.Shape, steps: int,
          seed: int = 0) -> Dict:
    """loss_fn(model, tokens [b, s], labels [b, s]) -> scalar loss."""
    opt = adamw(model)
    gen = torch.Generator().manual_seed(seed)
    out = {"iteration_times": [], "iteration_cpu_times": [], "losses": [], "first_step_at": None}
    for step in range(steps):
        if step == 0:
            out["first_step_at"] = time.time()
        wall, cpu = time.perf_counter(), time.process_time()
        for group in opt.param_groups:
            group["lr"] = facts.lr_at(step, steps)
        data = torch.randint(0, shape.vocab, (shape.batch, shape.seq + 1), generator=gen)
        loss = loss_fn(model, data[:, :-1], data[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), facts.CLIP)
        opt.step()
        out["losses"].append(loss.item())
        float(norm)
        out["iteration_times"].append(time.perf_counter() - wall)
        out["iteration_cpu_times"].append(time.process_time() - cpu)
    out["parameters"] = sum(p.numel() for p in model.parameters())
    return out
