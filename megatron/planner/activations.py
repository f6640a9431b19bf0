"""Activation memory per transformer layer (Korthikanti et al. 2022), generalised.

Counted tensor by tensor so that GQA, SwiGLU, the FFN width, dropout and fp32 activations are
exact extensions of the paper's formula; with GeLU, FFN 4h, MHA, dropout on and 16-bit
activations it reduces to s*b*h*(10 + 24/t + 5*a*s/(h*t)) bytes (34 + 5as/h without TP), and
with sequence parallelism to s*b*h*(34 + 5*a*s/h)/t. FlashAttention keeps no s x s tensor (it
saves the log-sum-exp rows and recomputes scores); selective recompute drops the same terms;
full recompute keeps only the layer input and rebuilds one layer at a time in backward.

Context parallelism (Ulysses, Layout.cp = C) gives each rank s/C of every sequence: every
token-local tensor is 1/C; attention's q, k, v, context, scores and log-sum-exp rows are the
whole sequence for heads/C heads, also 1/C of them, except key/value heads the exchange
replicates (kv_replicas: fewer key/value heads per TP rank than C, or ones that do not split)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

from megatron.config import ModelConfig, variants
from megatron.config.model_math import masked_keys
from megatron.planner.layout import Layout


def fc1_factor(m: ModelConfig) -> int:
    """fc1's width in units of ffn_hidden_size (the activation's record: SwiGLU's [gate; up])."""
    return variants.of(m, "activation").fc1_factor


def act_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


@dataclass(frozen=True)
class LayerActivations:
    replicated: float   # elements every TP rank keeps whole (divided by t only with SP)
    partitioned: float  # elements split over TP
    masks: float        # one-byte dropout masks, replicated part
    scores: float       # s x s elements per head group (softmax out, dropout out), split by TP
    score_masks: float  # one-byte attention dropout mask over the scores, split by TP
    lse: float          # fp32 log-sum-exp rows FlashAttention saves, split by TP


def kv_replicas(kv_heads: int, q_per_group: int, cp: int) -> int:
    """Copies of each key/value head the Ulysses exchange sends: megatron/parallel/ulysses.py's
    kv_replicas (which imports torch; the planner must not), held equal by
    tests/unit/test_planner_context_parallel.py."""
    if kv_heads % cp == 0:
        return 1
    r = cp // math.gcd(kv_heads, cp)
    return r if q_per_group % r == 0 else q_per_group


def layout_kv_replicas(m: ModelConfig, lay: Layout) -> int:
    """kv_replicas for one TP rank's key/value heads under the layout's context parallelism."""
    u = lay.cp_parts[0]
    if u == 1:
        return 1
    groups = max(1, m.kv_heads // lay.tp)
    return kv_replicas(groups, m.num_attention_heads // lay.tp // groups, u)


def local_tokens(m: ModelConfig, lay: Layout) -> int:
    """Tokens of one micro-batch on one rank: s*b, 1/C of them under context parallelism."""
    return m.seq_length * lay.micro_batch // lay.cp


def layer_terms(m: ModelConfig, s: int, b: int, cp: int = 1,
                replicas: int = 1) -> LayerActivations:
    """Stored tensors of one layer, unsharded over TP, for b sequences of length s on one of
    cp context-parallel ranks (key/value heads sent `replicas` times: kv_replicas)."""
    h, f, kvh = m.hidden_size, m.ffn_hidden_size, m.kv_heads * m.head_dim
    a, sb = m.num_attention_heads, s * b // cp
    hidden_drop = m.hidden_dropout > 0
    attn_drop = m.attention_dropout > 0
    # norm1 input, QKV input, norm2 input, fc1 input; model.residual.post_norms: the two
    # post-norms' inputs (the out-projection's and fc2's outputs)
    replicated = (6 if m.residual.post_norms else 4) * sb * h
    # Q and K for QK^T, V for the weighted sum, the attention context (out-proj input); the
    # query heads are a x head_dim wide (h unless model.attention.kv_channels says otherwise)
    qd = a * m.head_dim
    partitioned = sb * (qd + kvh * replicas) + sb * kvh * replicas + sb * qd
    if m.attention.qk_norm:  # the per-head norms' inputs, Q and K as projected
        partitioned += sb * (qd + kvh)
    # GeLU: its input and fc2's input; SwiGLU: both fc1 halves and fc2's input
    partitioned += sb * f * (fc1_factor(m) + 1)
    masks = 2 * sb * h if hidden_drop else 0
    # heads/C over the whole sequence, each query's scores over every key or its window's band
    # (config/model_math.masked_keys)
    keys = masked_keys(m) if s == m.seq_length else s
    # softmax out, dropout out, and under model.attention.logit_softcapping the capped scores
    # (tanh's output, which its backward reads)
    scores = a // cp * s * keys * b * ((2 if attn_drop else 1)
                                       + (1 if m.attention.logit_softcapping else 0))
    score_masks = a // cp * s * keys * b if attn_drop else 0
    return LayerActivations(replicated, partitioned, masks, scores, score_masks, a * sb)


def layer_full_bytes(m: ModelConfig, lay: Layout, precision: str, keep_scores: bool,
                     whole_inputs: bool = False) -> float:
    """Bytes one layer stores for backward on one TP rank, without full recompute.
    whole_inputs: under SP the QKV and fc1 inputs are kept as gathered, whole on every TP rank
    (Overlap.sp_whole_inputs), not as this rank's shard: two of the four replicated tensors."""
    t, e = lay.tp, act_bytes(precision)
    terms = layer_terms(m, m.seq_length, lay.micro_batch, lay.cp, layout_kv_replicas(m, lay))
    rep = 1.0 / t if lay.sequence_parallel else 1.0
    total = (terms.replicated * e + terms.masks) * rep + terms.partitioned * e / t
    if whole_inputs and lay.sequence_parallel:
        total += terms.replicated / 2 * e * (1 - rep)
    if keep_scores:
        total += (terms.scores * e + terms.score_masks) / t
    elif lay.flash:
        total += terms.lse * 4 / t
    return total


def layer_stored_bytes(m: ModelConfig, lay: Layout, precision: str,
                       flash_cp: bool = False, whole_inputs: bool = False) -> float:
    """Bytes one layer keeps per micro-batch in flight, under the layout's recompute policy.
    flash_cp: the key/value exchange runs in Transformer Engine's flash-based CP attention
    (ring_explicit); whole_inputs: layer_full_bytes'."""
    if lay.recompute == "full":
        rep = 1.0 / lay.tp if lay.sequence_parallel else 1.0
        return local_tokens(m, lay) * m.hidden_size * act_bytes(precision) * rep
    ring = lay.cp_parts[1] > 1
    keep_scores = not lay.flash and lay.recompute == "none" and not ring
    total = layer_full_bytes(m, lay, precision, keep_scores, whole_inputs)
    if ring and lay.recompute == "none":
        total += ring_explicit_kept_bytes(m, lay, precision) if ring_explicit(m, lay, flash_cp) \
            else ring_kept_bytes(m, lay, precision)
    return total


def ring_explicit(m: ModelConfig, lay: Layout, flash_cp: bool = False) -> bool:
    """Whether the key/value exchange keeps only what an explicit backward needs (the
    log-sum-exp and the merged output, not every block pair's scores): in this trainer
    (model/context_attention.py) the ring and hybrid algorithms without attention dropout,
    while allgather and dropout take autograd's form; under Transformer Engine's CP attention
    (flash_cp: framework megatron-core, whose flash kernels run every block) every algorithm."""
    if lay.cp_parts[1] <= 1:
        return False
    return flash_cp or (lay.cp_algo in ("ring", "hybrid") and not m.attention_dropout)


def ring_explicit_kept_bytes(m: ModelConfig, lay: Layout, precision: str) -> float:
    """What the explicit ring keeps per layer beyond q, k, v and the output the layer keeps
    anyway: the fp32 log-sum-exp of each query row and head, and in 16-bit training the fp32
    output it merged (the layer keeps its 16-bit copy)."""
    rows = local_tokens(m, lay) * m.num_attention_heads / lay.tp  # a ring rank's rows x heads
    out = rows * m.head_dim * 4 if act_bytes(precision) != 4 else 0.0
    return rows * 4 + out


def ring_explicit_working_bytes(m: ModelConfig, lay: Layout, precision: str) -> float:
    """The explicit ring's transient bytes in one layer's backward: one chunk pair's fp32
    scores, probabilities and their two gradients (heads/(t U) x b x (s/2R)^2 each), the
    fp32 gradients of q and of the key/value block it holds, and the block and its gradient
    arriving from the previous rank."""
    u, r = lay.cp_parts
    chunk = m.seq_length / (2 * r)
    heads = m.num_attention_heads / lay.tp / u
    pair = 4 * heads * lay.micro_batch * chunk * chunk * 4
    block = kv_block_bytes(m, lay, precision)
    rows = local_tokens(m, lay) * m.num_attention_heads / lay.tp
    return pair + rows * m.head_dim * 4 + 2 * block + 2 * block * 4 / act_bytes(precision)


def kv_block_bytes(m: ModelConfig, lay: Layout, precision: str) -> float:
    """One rank's key/value block as the ring or the all-gather moves it: its s/C tokens of k
    and v, the TP rank's key/value heads (with Ulysses' replicas under hybrid)."""
    kvh = max(1, m.kv_heads // lay.tp) * layout_kv_replicas(m, lay)
    return local_tokens(m, lay) * 2 * kvh * m.head_dim * act_bytes(precision)


def ring_kept_bytes(m: ModelConfig, lay: Layout, precision: str) -> float:
    """What the ring part (R ranks; ring, allgather, hybrid) keeps per layer for backward in
    this implementation (docs/context_parallel.md, "Backward"): the R - 1 key/value blocks it
    received (or gathered) beside its own, and the fp32 scores and probabilities of every
    attended chunk pair: its two query chunks of s/2R against the key chunks at or before
    them, 2R + 1 pairs of the 4R^2 under the load balance, for the heads/(t U) it holds."""
    u, r = lay.cp_parts
    if r == 1:
        return 0.0
    chunk = m.seq_length / (2 * r)
    heads = m.num_attention_heads / lay.tp / u
    scores = (2 * r + 1) * heads * lay.micro_batch * chunk * chunk * 8
    return (r - 1) * kv_block_bytes(m, lay, precision) + scores


def linear_io_elements(m: ModelConfig, lay: Layout) -> Tuple[float, float]:
    """(X, dY) elements of one layer's linear layers on one rank per micro-batch: their inputs
    X (QKV's and fc1's replicated over TP, divided with SP as layer_terms counts them; the
    out-projection's and fc2's split) and their output gradients dY (QKV's and fc1's split; the
    out-projection's and fc2's replicated). What a weight gradient dW = dY^T X reads, and what
    FP8 casts (planner/fp8.py)."""
    sb, t = local_tokens(m, lay), lay.tp
    h, f, kvh = m.hidden_size, m.ffn_hidden_size, m.kv_heads * m.head_dim
    rep = 1.0 / t if lay.sequence_parallel else 1.0
    x = 2 * sb * h * rep + (sb * m.num_attention_heads * m.head_dim + sb * f) / t
    dy = 2 * sb * h * rep + (sb * (h + 2 * kvh) + sb * fc1_factor(m) * f) / t
    return x, dy


def layer_weight_grad_bytes(m: ModelConfig, lay: Layout, precision: str) -> float:
    """Bytes one layer keeps per micro-batch whose W is pending under zbh1: each linear layer's
    input X and output gradient dY (linear_io_elements), everything else freed by its B. Under
    full recompute these are the rebuilt tensors, which 1F1B would have freed with the
    backward."""
    x, dy = linear_io_elements(m, lay)
    return (x + dy) * act_bytes(precision)


def head_weight_grad_bytes(m: ModelConfig, lay: Layout, padded_vocab: int,
                           precision: str) -> float:
    """The output head's pending W on the last stage: its input (s*b*h) and the logits'
    gradient (s*b*V/t), in the activation dtype."""
    e, sb = act_bytes(precision), local_tokens(m, lay)
    return sb * (m.hidden_size + padded_vocab / lay.tp) * e


def layer_working_bytes(m: ModelConfig, lay: Layout, precision: str,
                        flash_cp: bool = False, whole_inputs: bool = False) -> float:
    """Transient bytes while one layer runs backward: its rebuilt activations under full
    recompute (the math path's scores included) plus the activation gradients in flight."""
    e, sb = act_bytes(precision), local_tokens(m, lay)
    width = max(m.hidden_size, fc1_factor(m) * m.ffn_hidden_size // lay.tp)
    grads = 2 * sb * width * e
    if ring_explicit(m, lay, flash_cp):
        grads += ring_explicit_working_bytes(m, lay, precision)
    elif lay.recompute != "none" and lay.cp_parts[1] > 1:
        # the recomputed attention's ring blocks and scores, one layer's
        grads += ring_kept_bytes(m, lay, precision)
    if lay.recompute != "full":
        return grads
    keep = not lay.flash and lay.cp_parts[1] == 1
    return grads + layer_full_bytes(m, lay, precision, keep_scores=keep,
                                    whole_inputs=whole_inputs)


def logits_elems(m: ModelConfig, lay: Layout, padded_vocab: int,
                 whole_vocab: bool = False) -> float:
    """Logits of one micro-batch on one rank of the last stage: s*b*V/t, or s*b*V where the
    output layer gathers them (Overlap.whole_vocab_logits)."""
    return local_tokens(m, lay) * padded_vocab / (1 if whole_vocab else lay.tp)


def logits_bytes(m: ModelConfig, lay: Layout, padded_vocab: int, precision: str,
                 whole_vocab: bool = False) -> float:
    """Output layer and cross-entropy for one micro-batch on the last stage at their peak.
    Megatron's vocab-parallel loss: the logits in the activation dtype, their fp32 copy and the
    saved fp32 softmax. whole_vocab (Overlap.whole_vocab_logits): the logits gathered and an
    eager fp32 cross-entropy over the whole vocabulary on every TP rank (Scaling's
    losses/cross_entropy.py: logits.float(), then torch's cross_entropy), whose peak is in its
    backward: the gathered logits, the saved fp32 log-softmax, the NLL's fp32 gradient and the
    log-softmax's fp32 gradient (the fp32 copy is gone by then: nothing saved it). Under
    model.output.logit_softcapping the capped logits too (tanh's output, in the activation
    dtype, which its backward reads)."""
    extra = 12 if whole_vocab else 8
    capped = act_bytes(precision) if m.output.logit_softcapping else 0
    per_logit = act_bytes(precision) + extra + capped
    return logits_elems(m, lay, padded_vocab, whole_vocab) * per_logit


def boundary_bytes(m: ModelConfig, lay: Layout, precision: str) -> float:
    """One stage output (or embedding output) of one micro-batch: s*b*h activations."""
    rep = 1.0 / lay.tp if lay.sequence_parallel else 1.0
    return local_tokens(m, lay) * m.hidden_size * act_bytes(precision) * rep


def korthikanti_bytes(s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False,
                      flash: bool = False) -> float:
    """The paper's closed forms (16-bit activations, dropout on), for cross-checks."""
    score = 0.0 if flash else 5 * a * s / h
    if sp:
        return s * b * h * (34 + score) / t
    return s * b * h * (10 + 24 / t + score / t)
