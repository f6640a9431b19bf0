"""Step time of a layout: compute, memory-bound kernels, TP/PP/DP communication, the bubble.

The model is linear in a handful of constants once the GEMM-efficiency curve is fixed:
step = theta . features, theta = (1/gemm_eff, 1/flash_attn_eff, 1/hbm_eff, 1/comm_eff,
latency, per-micro-batch and per-step overheads, the two link factors across nodes, the
share DeepSpeed's pipeline engine adds to each slot and the seconds it adds for each layer of the
slot's stage). Calibration fits theta by least squares.

Overlap follows the engine (overlap.py, ClusterSpec.framework; docs/planner.md "Overlap by
framework"). For this trainer's DeepSpeed: TP collectives and pipeline sends are blocking
(Megatron-style TP, DeepSpeed's synchronous pipeline engine); the DP gradient reduction hides
the share the run's overlap_comm claims (zero_settings.overlap_claim: every bucket but the
last; at least dp_overlap) behind the backward, at most one micro-batch's backward (every
micro-batch's at ZeRO-2/3); weight all-gathers and the optimizer step are exposed.
TP collectives per layer: two forward, two backward (Megatron's conjugate operators), two more
under full recompute. Pipeline sends: each TP rank sends its 1/t slice of the boundary and the
receiver all-gathers them inside the node (Megatron-LM's scatter/gather, DeepSpeed's
pipe_partitioned; whole slices already under SP).
How the stages' micro-batches compose into a step is the pipeline schedule's own closed form
(its record in config/schedules: Schedule.pipeline_time and bubble). 1F1B: step = (m - 1) *
slowest stage + sum over stages, i.e. (m + p - 1) slots when balanced, a bubble of
(p - 1)/(m + p - 1); the interleaved schedule (a comparison option, not run by this trainer)
divides the fill and drain by its chunks per stage v. A schedule that splits the backward
(Schedule.split_backward; ZB-H1, Qi et al. 2023) runs it as B (input gradients, the attention
core, norms, biases, the TP and pipeline communication, recompute) and W (the weight-gradient
GEMMs: dW = dY^T X of every linear layer and the output head, and the embedding's scatter-add),
which fills the slots where the stage would idle; with balanced stages ZB-H1's step = m (F + B +
W) + (p - 1)(F + B - W) + max(0, p - m) W, what engine/pipe_order.makespan replays for the
schedule the engine runs (tests/unit/test_planner_zero_bubble.py).
Context parallelism (Ulysses, Layout.cp = C): every rank computes on s/C tokens (attention on
the whole sequence for heads/C heads: 1/C of its FLOPs too); each layer adds two all-to-alls
forward (q, k and v together; the attention output) and two backward, and two more where
recompute replays the exchange (full and selective), over the C ranks' link (tp x C inside a
node: the node's; else the NICs' share, hardware.ClusterSpec.group_gbps); gradients are reduced
over dp x cp."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

from megatron.config import moe, schedules
from megatron.config.model_math import attention_keys, masked_keys
from megatron.base.optimizer_kind import optimizer_kind
from megatron.planner import activations as act, cp_timing, experts, fp8
from megatron.planner.features import (  # noqa: F401 (the names timing has always exported)
    ATTN, COMM, COMM_X, FEATURES, GEMM, LAT, LAT_X, MB, MEM, PIPE, PLAYER, STEP, dot, gemm_seconds,
    theta)
from megatron.planner.flops import hardware_flops, model_flops
from megatron.planner.grad_dtype import wire_bytes
from megatron.planner.hardware import Link
from megatron.planner.layout import Job, Layout, layout_stage_layer_indices
from megatron.planner.overlap import DEEPSPEED, OVERLAP, exposed_share
from megatron.planner.params import StageParams, all_stage_params, padded_vocab
from megatron.planner.profile import Profile
from megatron.planner.zero_settings import comm_bytes, overlap_claim, profile_settings

class _Ctx:
    """Per-layout quantities the feature functions share."""

    def __init__(self, job: Job, lay: Layout, prof: Profile):
        self.job, self.lay, self.spec, self.c = job, lay, prof.spec, prof.constants
        self.m = job.model
        self.peak = prof.spec.matmul_tflops(job.precision) * 1e12
        # the linear layers' GEMMs: FP8's peak under Job.fp8 (fp8.py)
        self.linear_peak = fp8.linear_tflops(job, prof.spec, self.c.fp8_gemm_eff) * 1e12
        self.hbm = prof.spec.hbm_gbps * 1e9
        self.e = act.act_bytes(job.precision)
        self.tokens = act.local_tokens(self.m, lay)
        self.tp_link = prof.spec.link(lay.tp, 1)
        # the Ulysses group: U ranks spaced tp apart (state.py: pp, dp, cp, tp; U = C but under
        # hybrid, whose ring crosses the groups: cp_timing.py)
        self.cp_link = prof.spec.link(lay.cp_parts[0], lay.tp)
        self.vocab = padded_vocab(self.m.vocab_size, self.m.make_vocab_size_divisible_by, lay.tp)
        # overlap_comm, bucket and communication dtype as the trainer will run this layout
        self.ds = profile_settings(job, lay, prof.constants)
        self.overlap = OVERLAP[prof.spec.framework]
        self.th = theta(prof.constants)

    @staticmethod
    def collective(f: np.ndarray, bus_bytes: float, link: Link, calls: float = 1):
        """`calls` collectives of `bus_bytes` each (nccl-tests' bus bytes) over `link`."""
        if link.bus_bytes_per_s != float("inf"):
            f[COMM_X if link.inter else COMM] += calls * bus_bytes / link.bus_bytes_per_s
            f[LAT_X if link.inter else LAT] += calls * link.alpha_s

    def allreduce(self, f: np.ndarray, nbytes: float, size: int, link: Link, calls: float = 1):
        if size > 1:
            self.collective(f, 2 * (size - 1) / size * nbytes, link, calls)


def _linear_dims(x: _Ctx) -> Tuple[Tuple[float, float, float], ...]:
    """(M, N, K) of the four linear layers' forward GEMMs on one rank: QKV and fc1
    (column-parallel), the out-projection and fc2 (row-parallel)."""
    m, t, tok = x.m, x.lay.tp, x.tokens
    h, f, d = m.hidden_size, m.ffn_hidden_size, m.head_dim
    fc1 = act.fc1_factor(m) * f
    return ((tok, (m.num_attention_heads + 2 * m.kv_heads) * d / t, h),
            (tok, h, m.num_attention_heads * d / t), (tok, fc1 / t, h), (tok, h, f / t))


def _gate_up_split(x: _Ctx) -> bool:
    """Whether the engine runs SwiGLU's gate and up projections as two column-parallel layers
    (Overlap.gate_up_split) and the model has them."""
    return x.overlap.gate_up_split and act.fc1_factor(x.m) == 2


def linear_gemms(x: _Ctx, column_only: bool = False) -> np.ndarray:
    """The four linear layers' forward GEMMs of one layer (QKV, out-projection, fc1, fc2) for
    one micro-batch on one rank; their weight gradients (dW = dY^T X) cost the same again.
    column_only: QKV and fc1 alone. Under Overlap.gate_up_split fc1 is two GEMMs of half its
    width."""
    dims = _linear_dims(x)
    out = np.zeros(len(FEATURES))
    for i, d in enumerate(dims):
        if column_only and i in (1, 3):
            continue
        if i == 2 and _gate_up_split(x):
            out[GEMM] += 2 * gemm_seconds((d[0], d[1] / 2, d[2]), x.linear_peak,
                                          x.c.gemm_half_dim)
        else:
            out[GEMM] += gemm_seconds(d, x.linear_peak, x.c.gemm_half_dim)
    return out


def _layer_forward(x: _Ctx) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward compute, attention core alone, forward TP collectives) of one layer for one
    micro-batch on one rank."""
    m, t, tok = x.m, x.lay.tp, x.tokens
    h, d = m.hidden_size, m.head_dim
    fwd, core = linear_gemms(x), np.zeros(len(FEATURES))
    heads = x.lay.micro_batch * m.num_attention_heads / t / x.lay.cp
    s = m.seq_length
    if x.lay.flash:  # a flash kernel skips the blocks a sliding window hides (attention_keys)
        core[ATTN] = 4 * tok * attention_keys(m) * m.num_attention_heads * d / t / x.peak
    else:  # every key's score, or under a sliding window its band's (masked_keys)
        keys = masked_keys(m)
        core[GEMM] = 2 * heads * gemm_seconds((s, keys, d), x.peak, x.c.gemm_half_dim)
        # scores written by QK^T, read and written by softmax and dropout, read by AV
        core[MEM] = 4 * heads * s * keys * x.e / x.hbm
    fwd += core
    fwd[MEM] += act.layer_full_bytes(m, x.lay, x.job.precision, keep_scores=False,
                                     whole_inputs=x.overlap.sp_whole_inputs) / x.hbm
    tp = np.zeros(len(FEATURES))
    # two all-reduces (with SP: two all-gathers and two reduce-scatters, the same bus bytes):
    # after the attention block and after the MLP
    x.allreduce(tp, tok * h * x.e, t, x.tp_link, calls=2)
    return fwd, core, tp


def _exposed_tp(x: _Ctx, tp: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(forward, backward) TP collectives left exposed: all of them; under Transformer
    Engine's overlap (SP only), what one pass (forward) or two (backward) of the layer's linear
    GEMMs cannot cover; under Megatron-LM's asynchronous backward collective (tp_wgrad), the
    forward's all exposed and the backward's two (one per column-parallel layer) less what
    those two layers' weight-gradient GEMMs cover."""
    if x.lay.tp <= 1:
        return tp, tp
    # Under SP the engines with the asynchronous backward keep only the shard of each
    # column-parallel layer's input and all-gather it again in the backward, under that layer's
    # input-gradient GEMM (Korthikanti et al. 2022, section 4.2.2; this trainer's
    # parallel/layers._ColumnLinear): two more all-gathers, the forward's bus bytes each.
    regather = np.zeros(len(FEATURES))
    if x.lay.sequence_parallel and (x.overlap.tp_wgrad or x.overlap.tp_comm):
        t = x.lay.tp
        x.collective(regather, (t - 1) / t * x.tokens * x.m.hidden_size * x.e, x.tp_link, 2)
    if x.overlap.tp_comm and x.lay.sequence_parallel:
        comm_s, gemm_s = dot(x.th, tp), dot(x.th, linear_gemms(x))
        back = tp + regather
        return tp * exposed_share(comm_s, gemm_s), back * exposed_share(
            dot(x.th, back), 2 * gemm_s)
    if x.overlap.tp_wgrad:
        column_s = dot(x.th, linear_gemms(x, column_only=True))
        comm_s, gather_s = dot(x.th, tp), dot(x.th, regather)
        return tp, (tp * exposed_share(comm_s, column_s) +
                    regather * exposed_share(gather_s, column_s))
    return tp, tp


def ulysses_bytes(x: _Ctx) -> Tuple[float, float]:
    """Bytes one rank hands the two forward all-to-alls of a layer under context parallelism:
    q, k and v (key/value heads with their replicas) and the attention output, [s/C, b, ...]."""
    m, t = x.m, x.lay.tp
    r = act.layout_kv_replicas(m, x.lay)
    heads = m.num_attention_heads // t
    kv = max(1, m.kv_heads // t) * r
    return (x.tokens * (heads + 2 * kv) * m.head_dim * x.e,
            x.tokens * heads * m.head_dim * x.e)


def ulysses_features(x: _Ctx) -> np.ndarray:
    """The forward's two all-to-alls: each rank keeps 1/C of its tensor and sends the rest,
    bus bytes (C - 1)/C of it (nccl-tests' alltoall convention)."""
    f = np.zeros(len(FEATURES))
    c = x.lay.cp_parts[0]
    if c > 1:
        for nbytes in ulysses_bytes(x):
            x.collective(f, (c - 1) / c * nbytes, x.cp_link)
    return f


def layer_features(x: _Ctx) -> np.ndarray:
    """Forward, backward (twice the forward's compute; flash backward 2.5x) and recompute of
    one layer. The TP collectives are conjugate pairs (Shoeybi et al. 2019, section 3): two in
    the forward, two in the backward (an all-reduce's backward is the identity and the
    identity's an all-reduce), two more where full recompute replays the forward. Under context
    parallelism the exchange's all-to-alls once forward and once backward, and once more where
    recompute replays the attention."""
    fwd, core, tp = _layer_forward(x)
    a2a = ulysses_features(x)
    if x.lay.cp_parts[1] > 1:  # ring, allgather, hybrid: the key/value exchange
        a2a = a2a + cp_timing.kv_exchange_features(x, core)
    tp_fwd, tp_bwd = _exposed_tp(x, tp)
    if _gate_up_split(x) and not x.lay.sequence_parallel:
        # the gate's and the up projection's input gradients all-reduced each: one all-reduce
        # more than the layer's two (the engine overlaps none of them); a copy, since tp_bwd
        # may be tp_fwd itself
        tp_bwd = tp_bwd.copy()
        x.allreduce(tp_bwd, x.tokens * x.m.hidden_size * x.e, x.lay.tp, x.tp_link)
    total = 3 * fwd + 2 * a2a + tp_fwd + tp_bwd
    total[ATTN] += 0.5 * core[ATTN]
    if x.job.fp8:  # the linear layers' inputs cast each forward, their output gradients once
        fwd_cast, bwd_cast = fp8.cast_bytes(x.m, x.lay)
        forwards = 2 if x.lay.recompute == "full" else 1
        total[MEM] += (forwards * fwd_cast + bwd_cast) / x.hbm
    if x.lay.recompute == "full":
        total += fwd + a2a + tp_fwd
    elif x.lay.recompute == "selective":
        # the attention core, with the exchange around it (attention._core) under CP
        total += core + a2a
    return total


def boundary_send_bytes(x: _Ctx, whole: float) -> float:
    """Bytes one rank sends per pipeline hop of a stage output of `whole` bytes
    (act.boundary_bytes). Every engine here splits it over the TP ranks, each sending its slice
    on its own link and the receiver all-gathering them (Megatron-LM's scatter/gather
    optimisation, Narayanan et al. 2021 section 4.1; DeepSpeed's pipeline engine with
    pipeline.pipe_partitioned and grad_partitioned, on by default); under SP it is already
    split."""
    return whole if x.lay.sequence_parallel else whole / x.lay.tp


def stage_features(x: _Ctx, layers: int, first: bool, last: bool,
                   turn: bool = False, moe_layers: Optional[int] = None) -> np.ndarray:
    """One micro-batch through one stage: its layers, embedding (first) or output layer and loss
    (last: the stage that holds them, Layout.head_stage), pipeline sends. turn: the stage where
    a V-shaped schedule's chunks turn back (ZB-V's last stage), whose two chunks hand the
    activation and its gradient to each other without a send. moe_layers: the MoE layers among
    `layers` (stage_keys counts them; None: the model's share, experts.stage_moe_share)."""
    f = layers * layer_features(x)
    if x.m.moe.num_experts:
        f += experts.stage_delta_features(x, layers, moe_layers)
    tok, h, t = x.tokens, x.m.hidden_size, x.lay.tp
    if first:
        f[MEM] += 3 * tok * h * x.e / x.hbm
        x.allreduce(f, tok * h * x.e, t, x.tp_link)
    if last:
        f[GEMM] += 3 * gemm_seconds((tok, x.vocab / t, h), x.peak, x.c.gemm_half_dim)
        if x.overlap.whole_vocab_logits and t > 1:
            # every rank's logits all-gathered (its backward keeps this rank's slice, no
            # collective), the loss's passes over the whole vocabulary on every rank
            x.collective(f, (t - 1) / t * tok * x.vocab * x.e, x.tp_link)
            f[MEM] += 3 * tok * x.vocab * (x.e + 8) / x.hbm
        else:
            f[MEM] += 3 * tok * x.vocab / t * (x.e + 8) / x.hbm
        x.allreduce(f, tok * h * x.e, t, x.tp_link)
    if x.lay.pp > 1:
        # each model chunk sends its output forward and its input gradient back; interleaved,
        # every stage holds v chunks and only the first chunk's input and last one's output
        # stay put
        v = x.lay.interleave
        hops = 4 * v - (2 if last else 0) - (2 if first else 0) - (4 if turn else 0)
        link = x.spec.link(2, x.lay.tp * x.lay.dp * x.lay.cp)
        if not (x.overlap.pipe_send and v > 1):  # overlap_p2p_comm: interleaved only
            whole = act.boundary_bytes(x.m, x.lay, x.job.precision)
            x.collective(f, boundary_send_bytes(x, whole), link, hops)
            if t > 1 and not x.lay.sequence_parallel:
                # the receiver's all-gather of the TP ranks' slices, one per received hop
                x.collective(f, (t - 1) / t * whole, x.tp_link, hops / 2)
    f[MB] += 1
    if x.lay.pp > 1 and x.spec.framework in DEEPSPEED:
        # the pipeline engine's own cost: a share of the slot's time as priced so far, and a
        # fixed time for each layer of the stage (Constants.pipe_layer_s)
        f[PIPE] += dot(x.th[:PIPE], f[:PIPE])
        f[PLAYER] += layers
    return f


def weight_grad_features(x: _Ctx, layers: int, first: bool, last: bool,
                         moe_layers: Optional[int] = None) -> np.ndarray:
    """The W share of stage_features under a schedule that splits the backward (zbh1): the
    weight-gradient GEMMs (one forward GEMM's worth per linear layer, the output head.s on the
    last stage) and the embedding's gradient scatter-add (two of the three passes over its
    output that stage_features counts)."""
    w = layers * linear_gemms(x)
    if x.m.moe.num_experts:  # the MoE layers' experts, router and shared expert in W
        w[GEMM] += (experts.stage_moe_share(x.m, layers, moe_layers)
                    * experts.forward_gemm_delta(x))
    tok, h = x.tokens, x.m.hidden_size
    if first:
        w[MEM] += 2 * tok * h * x.e / x.hbm
    if last:
        w[GEMM] += gemm_seconds((tok, x.vocab / x.lay.tp, h), x.peak, x.c.gemm_half_dim)
    return w


def pipeline_features(lay: Layout, stages, weights, th: np.ndarray) -> np.ndarray:
    """The pipeline's share of a step. stages: (features of one micro-batch, count) per stage
    kind; weights: the W share of each (weight_grad_features; read by schedules that split the
    backward). The schedule's record composes them (Schedule.pipeline_time) around the slowest
    kind."""
    i = max(range(len(stages)), key=lambda k: dot(th, stages[k][0]))
    return schedules.get(lay.schedule).pipeline_time(lay.pipe, stages, weights, i)


def backward_window(x: _Ctx, stage_f: np.ndarray) -> float:
    """Seconds of one micro-batch's backward on a stage, its recompute included: the window in
    which DeepSpeed's overlap_comm reduces the buckets the layers above have already filled."""
    r = 1.0 if x.lay.recompute == "full" else 0.0
    return (2 + r) / (3 + r) * dot(theta(x.c), stage_f)


def hidden_share(claimed: float, reduce_s: float, window_s: float) -> float:
    """Share of a gradient reduction hidden behind the backward: what the settings claim (with
    overlap_comm, every bucket but the last; 0 without it or under the pipeline engine, which
    reduces after the last micro-batch), at most what the backward window can cover."""
    if claimed <= 0 or reduce_s <= 0:
        return 0.0
    return min(claimed, window_s / reduce_s)


def grad_claim(x: _Ctx, n: float, layers: int) -> float:
    """Share of the gradient reduction the engine claims to hide (overlap.Overlap.grad_reduce):
    DeepSpeed's overlap_comm claim, all but one layer's chunk (nanotron's DDP buckets at
    ZeRO-0), or nothing."""
    mode = x.overlap.grad_reduce
    if mode == "overlap_comm":
        return max(x.c.dp_overlap, overlap_claim(x.ds, x.lay.zero, n))
    if mode == "layer" or (mode == "ddp" and x.lay.zero == 0):
        return max(x.c.dp_overlap, 1 - 1 / max(1, layers))
    return x.c.dp_overlap


def grad_wire_bytes(x: _Ctx, kind: str) -> float:
    """Bytes per gradient element the DP reduction sends: DeepSpeed's communication_data_type,
    else the model dtype (fp32 for the torch optimizer and for aa-scaling, which casts its
    gradients for the all-reduce). Every other engine is priced so. Megatron
    reduces a bf16 model's gradients in fp32 by default (accumulate_allreduce_grads_in_fp32,
    which memory.megatron_state_bytes holds), but priced at 4 bytes its Megatron Core runs come
    out up to 20% slow (mc-32b), which they were not: docs/planner.md, "Memory by engine"
    (benchmarks/planner_rank_sensitivity.py prices that variant). Job.grad_dtype overrides.
    """
    fp32 = kind == "torch" or x.overlap.fp32_allreduce  # aa-scaling casts for the wire
    return wire_bytes(x.job.grad_dtype, comm_bytes(x.ds, 4 if fp32 else x.e))


def reduction_features(x: _Ctx, sp: StageParams, first_or_last: bool,
                       window_s: float = 0.0, layers: int = 1) -> np.ndarray:
    """Gradient reduction over DP by ZeRO stage, the tied-embedding sync (first_or_last: the
    stage holds one of the tied embedding's two copies, on different stages), the optimizer.
    window_s: one micro-batch's backward on the stage (backward_window); layers: the stage's
    transformer layers (the chunks an engine that overlaps per layer reduces)."""
    f = np.zeros(len(FEATURES))
    lay, n, d = x.lay, sp.total, x.lay.zero_dp
    kind = optimizer_kind(x.job.precision, lay.zero, lay.pp, x.job.grad_accum)
    grads = (4 if kind == "torch" else x.e) * n
    wire = grad_wire_bytes(x, kind) * n
    # the parameter all-gather's buffer: FP8 transformer weights under Job.fp8_params
    weights = fp8.gather_bytes(x.job, sp.transformer, n - sp.transformer, x.e)
    share = (d - 1) / d
    if d > 1:
        ga, link = lay.grad_accum, x.spec.link(d, lay.tp)
        # bus bytes of one call and the calls: the gradient reduction (all-reduce at ZeRO-0,
        # reduce-scatter once at ZeRO-1, every micro-batch at 2-3), then the weight all-gathers
        # (once after the step at ZeRO-1/2, forward and backward of every micro-batch at 3)
        grad_v, grad_n, other_v, other_n = {0: (2 * wire, 1, 0, 0), 1: (wire, 1, weights, 1),
                                            2: (wire, ga, weights, 1),
                                            3: (wire, ga, weights, 2 * ga)}[lay.zero]
        if lay.zero == 1 and (kind == "bf16" or x.overlap.fp32_allreduce):
            # BF16_Optimizer all-reduces (engine.allreduce_gradients), as aa-scaling's ZeRO
            grad_v = 2 * wire
        reduce = np.zeros(len(FEATURES))
        x.collective(reduce, share * grad_v, link, grad_n)
        per_window = dot(theta(x.c), reduce) / (ga if lay.zero >= 2 else 1)
        claim = grad_claim(x, n, layers)
        f += reduce * (1 - hidden_share(claim, per_window, window_s))
        if other_n:
            gather = np.zeros(len(FEATURES))
            x.collective(gather, share * other_v, link, other_n)
            if x.overlap.param_gather and lay.zero == 1:
                # the distributed optimizer's all-gather, per layer under the next forward
                # (one micro-batch's, a third of the backward window without recompute)
                fwd_s = window_s / (2 + (1.0 if lay.recompute == "full" else 0.0))
                gather *= 1 - hidden_share(1 - 1 / max(1, layers), dot(x.th, gather), fwd_s)
            f += gather
    if first_or_last and lay.pp > 1 and x.m.tie_embeddings:
        reach = x.spec.link(2, (lay.pp - 1) * lay.tp * d)
        x.allreduce(f, x.e * sp.word_embedding + x.e * sp.output_layer, 2, reach)
    sharded = kind in ("zero", "bf16")
    if x.overlap.grad_add_pass:  # every micro-batch: read 2 bytes, read and write 4 (nanotron)
        f[MEM] += lay.grad_accum * 10 * n / x.hbm
    # Adam reads and writes master, two moments and reads the fp32 gradient; grad norm.
    f[MEM] += ((n / d if sharded else n) * 32 + grads) / x.hbm
    return f


def stage_keys(m, lay) -> List[Tuple[int, bool, bool, bool, int]]:
    """Each stage's (layers, first, last, turn, moe), in stage order: first holds the
    embedding, last the output layer and loss (Layout.head_stage: the first stage under ZB-V,
    whose V ends where it began), turn the V's turn (ZB-V's last stage; stage_features), moe
    the MoE layers among its layers (those its model chunks hold: one more than another
    stage's where model.moe.layer_freq does not divide the layers a stage holds)."""
    turn = lay.head_stage == 0 and lay.pp > 1
    return [(len(held), i == 0, i == lay.head_stage, turn and i == lay.pp - 1,
             sum(moe.is_moe_layer(m, j) for j in held))
            for i, held in enumerate(layout_stage_layer_indices(m.num_layers, lay))]


def _stage_kinds(keys) -> List[Tuple[Tuple[int, bool, bool, bool, int], int]]:
    """(key, count) for each distinct stage key."""
    counts = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return list(counts.items())


def step_features(job: Job, lay: Layout, prof: Profile) -> Tuple[np.ndarray, dict]:
    x = _Ctx(job, lay, prof)
    th = theta(prof.constants)
    keys = stage_keys(job.model, lay)
    kinds = _stage_kinds(keys)
    per_key = {key: stage_features(x, *key) for key, _ in kinds}
    stages = [(per_key[key], n) for key, n in kinds]
    weights = [weight_grad_features(x, *key[:3], moe_layers=key[4]) for key, _ in kinds]
    pipe = pipeline_features(lay, stages, weights, th)
    slowest = max(range(len(stages)), key=lambda k: dot(th, stages[k][0]))
    layers_of = [key[0] for key in keys]  # layout_stage_layers, as stage_keys counted them
    params = all_stage_params(job.model, lay.tp, lay.pp, lay.ep, counts=layers_of,
                              head_stage=lay.head_stage)
    # the ends reduce the most, unless set first/last layer counts leave a middle stage more
    ends = sorted({0, lay.pp - 1, *([1] if lay.uneven and lay.pp > 2 else [])})
    # a tied embedding is summed between the stages of its two copies: none when one holds both
    tied = {0, lay.head_stage} if lay.head_stage != 0 else set()
    reduce_of = experts.reducer(reduction_features, job.model)
    reductions = [reduce_of(x, params[i], i in tied, backward_window(x, per_key[keys[i]]),
                            layers_of[i]) for i in ends]
    reduce = max(reductions, key=lambda f: dot(th, f))
    step = np.eye(len(FEATURES))[STEP]
    parts = {"pipeline": pipe, "reduce": reduce, "step": step, "slowest": stages[slowest][0],
             "slowest_w": weights[slowest]}
    return pipe + reduce + step, parts


def pipeline_bubble(lay: Layout, w_share: float = 1 / 3) -> float:
    """Idle share of a balanced pipeline under the layout's schedule (Schedule.bubble): for 1F1B
    (p - 1)/(m + p - 1), (p - 1)/(v m + p - 1) interleaved with v chunks per stage; w_share is
    the share of a stage's time per micro-batch that W takes where the backward is split."""
    return schedules.get(lay.schedule).bubble(lay.pipe, w_share)


@dataclass(frozen=True)
class TimeEstimate:
    step_s: float
    pipeline_s: float
    reduce_s: float
    bubble: float
    tokens_per_s: float
    tflops_per_gpu: float       # model FLOPs (MFU numerator)
    hw_tflops_per_gpu: float    # with recompute, as Megatron-DeepSpeed logs it
    mfu: float
    hfu: float
    features: Tuple[float, ...]


def step_time(job: Job, lay: Layout, prof: Profile) -> TimeEstimate:
    feats, parts = step_features(job, lay, prof)
    th = theta(prof.constants)
    step_s = dot(th, feats)
    peak = prof.spec.matmul_tflops(job.precision) * 1e12
    mf = model_flops(job.model, job.global_batch) / step_s / lay.world
    hf = hardware_flops(job.model, job.global_batch, lay.recompute) / step_s / lay.world
    slowest_s = dot(th, parts["slowest"])
    bubble = pipeline_bubble(lay, dot(th, parts["slowest_w"]) / slowest_s if slowest_s else 0)
    return TimeEstimate(step_s, dot(th, parts["pipeline"]), dot(th, parts["reduce"]), bubble,
                        job.global_batch * job.model.seq_length / step_s, mf / 1e12, hf / 1e12,
                        mf / peak, hf / peak, tuple(float(v) for v in feats))


def schedule_ratio(job: Job, lay: Layout, prof: Profile, schedule: str, over: str) -> float:
    """Predicted step time of `lay` under `schedule` over the same layout under `over`."""
    this, base = (step_time(job, dataclasses.replace(lay, schedule=s), prof).step_s
                  for s in (schedule, over))
    return this / base
