"""Autoregressive sampling from an unsharded GPTModel (TP=1, PP=1). Recomputes the whole window
each step: simple and exact, meant for demos and checks, not for serving."""
from __future__ import annotations

from typing import List, Optional

import torch


@torch.no_grad()
def sample(model, prompt: List[int], max_new_tokens: int, seq_length: int,
           temperature: float = 0.8, top_k: Optional[int] = 40, vocab_limit: Optional[int] = None,
           generator: Optional[torch.Generator] = None, eod: Optional[int] = None) -> List[int]:
    """Returns the new tokens. vocab_limit masks the padded (dummy) vocabulary entries."""
    model.eval()
    device = next(model.parameters()).device
    tokens = list(prompt)
    out: List[int] = []
    for _ in range(max_new_tokens):
        window = torch.tensor([tokens[-seq_length:]], dtype=torch.long, device=device)
        logits = model(window)[-1, 0].float()  # [s, b, V] -> last position
        if vocab_limit is not None:
            logits[vocab_limit:] = float("-inf")
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
                logits[logits < kth] = float("-inf")
            probs = torch.softmax(logits, dim=-1).cpu()
            nxt = int(torch.multinomial(probs, 1, generator=generator))
        if eod is not None and nxt == eod:
            break
        tokens.append(nxt)
        out.append(nxt)
    return out
