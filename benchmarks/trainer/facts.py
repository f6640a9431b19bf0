"""The facts the trainer and its two peers share in the overhead benchmark: the shape, the
optimizer, clipping, the schedule and the thread count. The peers are written from these facts,
not from the trainer's code.

Trainer side: fp32, AdamW over two groups (weight decay on matrices and embeddings, none on norms
and biases; torch's foreach implementation, which is what megatron/engine/optimizer.py uses on
a CPU), gradient clipping at global norm 1.0, linear warm-up then cosine decay, GPT-2 flavour
(learned positions, pre-LayerNorm, tanh-GeLU 4h MLP, biases, tied input/output embedding, no
dropout), one thread."""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    batch: int  # sequences per step (one micro-batch per step in the single-process comparison)

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq

    def as_dict(self) -> dict:
        return asdict(self)


# Issue 15's shape: GPT-2-like, 5.3M parameters.
ISSUE = Shape(layers=4, hidden=256, heads=4, seq=256, vocab=8192, batch=8)
# A shape that trains in a fraction of a second per step, for --tiny and the test.
TINY = Shape(layers=2, hidden=64, heads=4, seq=64, vocab=512, batch=4)

LR, MIN_LR, WARMUP = 1e-3, 1e-4, 2
BETAS, EPS, WEIGHT_DECAY = (0.9, 0.95), 1e-8, 0.1
CLIP = 1.0
INIT_STD = 0.02


def lr_at(step: int, total: int) -> float:
    """Linear warm-up over WARMUP steps, then cosine from LR to MIN_LR at `total`."""
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    ratio = min(1.0, (step - WARMUP) / max(1, total - WARMUP))
    return MIN_LR + (LR - MIN_LR) * 0.5 * (1.0 + math.cos(math.pi * ratio))


def megatron_overrides(shape: Shape, steps: int, run_dir: str) -> list:
    """The trainer's --set overrides for `shape` on one process (ZeRO-0, synthetic tokens)."""
    return [f"model.num_layers={shape.layers}", f"model.hidden_size={shape.hidden}",
            f"model.num_attention_heads={shape.heads}", f"model.seq_length={shape.seq}",
            f"model.vocab_size={shape.vocab}", "model.make_vocab_size_divisible_by=128",
            f"training.micro_batch_size={shape.batch}",
            f"training.global_batch_size={shape.batch}", f"training.train_iters={steps}",
            "training.precision=fp32", f"training.clip_grad={CLIP}", "training.log_interval=1",
            "training.tensorboard=false", "parallel.zero_stage=0", "data.synthetic=true",
            f"optimizer.lr={LR}", f"optimizer.min_lr={MIN_LR}",
            f"optimizer.lr_warmup_iters={WARMUP}", f"optimizer.weight_decay={WEIGHT_DECAY}",
            f"optimizer.adam_beta1={BETAS[0]}", f"optimizer.adam_beta2={BETAS[1]}",
            f"optimizer.adam_eps={EPS}", f"run.dir={run_dir}"]


def one_thread_env(env=None) -> dict:
    """The environment of a benchmark process: one intra-op thread (set again in the process)."""
    env = dict(os.environ if env is None else env)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return env
