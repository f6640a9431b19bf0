#!/usr/bin/env python3
"""The peer of the end-to-end benchmark: a plain PyTorch GPT of the same shape, trained the way
a PyTorch user would write it, in a process of its own.

    python benchmarks/e2e/peer_gpt.py --spec spec.json --result result.json

The model follows the facts of the trainer's GPT (megatron/model/gpt.py) without its code: learned
positions, pre-LayerNorm blocks, one QKV projection, causal attention through
F.scaled_dot_product_attention (flash kernels on Hopper), a 4h MLP with tanh-GeLU, biases,
tied input/output embeddings, no dropout, F.cross_entropy. Precision: fp32 weights, gradients and
AdamW states (fused AdamW on a GPU) with bf16 autocast for the forward and backward; the
trainer's ZeRO-1 instead keeps bf16 weights and gradients beside an fp32 master copy. Both
clip the gradient norm at 1.0. Step times come back per step; the benchmark drops the warm-up.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from megatron.training.metrics import memory_gb  # noqa: E402

PRECISION_POLICY = ("fp32 weights, gradients and AdamW states; bf16 autocast for forward and "
                    "backward; grad-norm clip 1.0")


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(
            2, 0, 3, 1, 4)  # 3 x [b, heads, s, d]
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class PeerGPT(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, seq: int, vocab: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, hidden), nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        # GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2L).
        for name, p in self.named_parameters():
            if p.ndim == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "fc2.weight")) \
                    else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied output layer, [b, s, V]
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(spec: dict) -> dict:
    """spec: layers, hidden, heads, seq, vocab, micro_batch, global_batch, iters, device."""
    device = torch.device(spec["device"])
    torch.manual_seed(1234)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with device:
        model = PeerGPT(spec["layers"], spec["hidden"], spec["heads"], spec["seq"], spec["vocab"])
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    fused = {"fused": True} if device.type == "cuda" else {"foreach": True}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, **fused)
    accum = spec["global_batch"] // spec["micro_batch"]
    step_times, losses = [], []
    def one_step(data):
        total = torch.zeros((), device=device)
        for micro in data:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model(micro[:, :-1], micro[:, 1:]) / accum
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total.item()  # waits for the step, as the trainer's loss read does

    profile_out = os.environ.get("PEER_PROFILE_OUT")  # profile_step.py: one step's profile
    for i in range(spec["iters"]):
        data = torch.randint(spec["vocab"], (accum, spec["micro_batch"], spec["seq"] + 1),
                             device=device)
        _sync(device)
        start = time.perf_counter()
        if profile_out and i == 5:
            from profile_step import profiled
            losses.append(profiled(lambda: one_step(data), profile_out, "plain PyTorch peer"))
        else:
            losses.append(one_step(data))
        _sync(device)
        step_times.append(time.perf_counter() - start)
    return {"step_times": step_times, "losses": losses, "peak_mem_gb": memory_gb(device),
            "parameters": sum(p.numel() for p in model.parameters()),
            "precision_policy": PRECISION_POLICY, "attention": "sdpa",
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", required=True, help="JSON file with the shape and batch")
    p.add_argument("--result", required=True, help="where to write the JSON result")
    args = p.parse_args(argv)
    result = train(json.loads(Path(args.spec).read_text()))
    Path(args.result).write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
