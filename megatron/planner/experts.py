"""Mixture of experts in the memory and time models (docs/moe.md; docs/planner.md "Mixture of
experts").

A MoE layer (config/moe.py) replaces the dense MLP by a router (h -> E, replicated, fp32) and
E experts of width moe.ffn_hidden_size, E / EP on each rank (Layout.ep). Per MoE layer and
micro-batch, with T = the tokens the rank routes and k = moe.top_k (under TP the layer takes its
1/t share of the rank's s b / C tokens, model/moe/layer.py, where the dense MLP takes all of
them at 1/t of its width: routed_tokens):
- stored for backward: the dense MLP's terms are replaced by k T rows of the expert MLP (its
  input, as dispatched, and fc1/activation outputs: k T (h + f_e (fc1_factor + 1)) elements)
  plus the router's fp32 logits and probabilities (2 x 4 T E bytes);
- compute: each rank receives, balanced, k T assignments spread over its E / EP experts (k T EP
  / E rows each), plus the router GEMM [T, h] x [h, E]; forward + backward = 3 forwards;
- communication: dispatch and combine, forward and backward: four all-to-alls of k T h
  activation bytes each, bus bytes (EP - 1)/EP of it, over the link of EP data-parallel ranks
  spaced tp x cp apart (inside a node or across nodes, hardware.ClusterSpec.link), plus the
  permutations' copies (read and write, twice each way) in HBM.
Megatron's engines split each expert over the TP ranks instead (overlap.Overlap.expert_tp, its
expert tensor parallelism): a rank receives its k T rows by the all-to-all, all-gathers them
over TP (t k T rows, at 1/t of each expert's width: the same FLOPs), and reduce-scatters the
output before the return, forward and backward (four collectives of (t - 1) k T h bytes a
rank over the TP link); it stores the gathered input, and holds 1/t of each of its experts'
parameters (expert_share).
Parameters and states: params.expert_params counts the E / EP experts a rank holds;
memory.stage_states partitions their optimizer states over the expert-data-parallel group
(dp x cp / EP ranks) and the dense parameters' over dp x cp; split_reduction reduces their
gradients over that group too."""
from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Optional

import numpy as np

from megatron.config import moe
from megatron.planner import activations as act, fp8
from megatron.planner.features import FEATURES, GEMM, MEM, gemm_seconds
from megatron.planner.layout import Layout, layout_stage_layer_indices
from megatron.planner.overlap import OVERLAP
from megatron.planner.params import StageParams, expert_params


def stage_moe_layers(m, lay: Layout, stage: int) -> int:
    """MoE layers among the transformer layers pipeline stage `stage` holds (its model chunks'
    under interleaving or ZB-V: layout_stage_layer_indices)."""
    held = layout_stage_layer_indices(m.num_layers, lay)[stage]
    return sum(moe.is_moe_layer(m, i) for i in held)


def routed_tokens(m, lay: Layout) -> float:
    """Tokens of one micro-batch a rank routes to experts: its s b / C (act.local_tokens), of
    which each of the t tensor-parallel ranks takes 1/t (the sequence-parallel shard, or its
    slice of the replicated input)."""
    return act.local_tokens(m, lay) / lay.tp


def expert_tp(lay: Layout, framework: str = "deepspeed") -> int:
    """The ranks each expert is split over: t where the engine splits experts over TP
    (Megatron's expert tensor parallelism), else 1 (this trainer's whole experts)."""
    return lay.tp if OVERLAP[framework].expert_tp else 1


def expert_dp(lay: Layout, framework: str = "deepspeed") -> int:
    """Ranks that hold the same experts and average their gradients (the expert-data-parallel
    group): a stage's tp x dp x cp ranks folded into EP x expert TP x this. This trainer keeps
    experts whole (expert TP 1) and fills EP with tensor-parallel ranks first
    (parallel/experts.expert_grid): tp x dp x cp / EP, so EP may exceed dp x cp. Megatron's
    engines split each expert over TP and carve EP out of dp x cp: dp x cp / EP
    (engine_run_problem refuses an EP that does not divide it there)."""
    return lay.tp * lay.zero_dp // (lay.ep * expert_tp(lay, framework))


def expert_share(lay: Layout, framework: str = "deepspeed") -> float:
    """Share of each of its experts' parameters a rank holds (1 / expert_tp)."""
    return 1 / expert_tp(lay, framework)


def stored_delta(m, lay: Layout, precision: str, framework: str = "deepspeed") -> float:
    """Bytes a MoE layer stores per micro-batch beyond the dense layer act.layer_stored_bytes
    counts (negative where the experts keep less than the dense MLP would); under expert TP
    the input gathered over TP, fc1's outputs at 1/t of the width."""
    if not m.moe.num_experts or lay.recompute == "full":
        return 0.0
    e, sb, k, fc1 = act.act_bytes(precision), act.local_tokens(m, lay), m.moe.top_k, \
        act.fc1_factor(m)
    rt = routed_tokens(m, lay)
    dense = sb * m.ffn_hidden_size * (fc1 + 1) * e / lay.tp
    gathered = expert_tp(lay, framework) * m.hidden_size  # the input, gathered under expert TP
    experts = k * rt * (gathered + moe.expert_ffn(m) * (fc1 + 1)) * e
    shared = sb * moe.shared_ffn(m) * (fc1 + 1) * e / lay.tp  # as the dense MLP stores
    return experts + shared + 2 * 4 * rt * m.moe.num_experts - dense


def working_delta(m, lay: Layout, precision: str) -> float:
    """What a MoE layer's backward adds to act.layer_working_bytes: the activation gradients
    of k T rows of fc1's output where they are wider than the dense layer's widest."""
    if not m.moe.num_experts:
        return 0.0
    e, sb = act.act_bytes(precision), act.local_tokens(m, lay)
    dense = sb * max(m.hidden_size, act.fc1_factor(m) * m.ffn_hidden_size // lay.tp)
    wide = routed_tokens(m, lay) * m.moe.top_k * act.fc1_factor(m) * moe.expert_ffn(m)
    return 2 * max(0, wide - dense) * e


def io_delta(m, lay: Layout, framework: str = "deepspeed") -> tuple:
    """(X, dY) elements a MoE layer's linear layers read beyond the dense layer's
    (act.linear_io_elements, which FP8's casts and a split backward's pending W read): the
    dense MLP's fc1 and fc2 inputs and output gradients replaced by the experts' k T rows (k T t
    rows gathered under expert TP, at 1/t of the width) and the shared expert's, a dense MLP."""
    if not m.moe.num_experts:
        return 0.0, 0.0
    sb, t, h, fc1 = act.local_tokens(m, lay), lay.tp, m.hidden_size, act.fc1_factor(m)
    rep = 1.0 / t if lay.sequence_parallel else 1.0
    g = expert_tp(lay, framework)
    rows, fe, fs = m.moe.top_k * routed_tokens(m, lay), moe.expert_ffn(m), moe.shared_ffn(m)

    def mlp(width):  # a dense MLP of `width` split over TP: (X, dY) of its fc1 and fc2
        return sb * h * rep + sb * width / t, sb * h * rep + sb * fc1 * width / t
    dense, shared = mlp(m.ffn_hidden_size), (mlp(fs) if fs else (0.0, 0.0))
    return (rows * (g * h + fe) + shared[0] - dense[0],
            rows * (g * h + fc1 * fe) + shared[1] - dense[1])


def fp8_kept_delta(m, lay: Layout, precision: str, framework: str = "deepspeed") -> float:
    """Bytes a MoE layer's FP8 copies change fp8.stored_delta by (where the layer keeps its
    activations): the experts' fc1 and fc2 inputs, not the dense MLP's, kept as 1-byte copies
    (the shared expert's as the dense MLP's): io_delta's inputs, e - 1 bytes each saved."""
    if not m.moe.num_experts or lay.recompute == "full":
        return 0.0
    return -(act.act_bytes(precision) - 1) * io_delta(m, lay, framework)[0]


def all_to_all_bytes(x) -> float:
    """Bytes one rank hands one dispatch (or combine) all-to-all: k T rows of h."""
    return x.tokens / x.lay.tp * x.m.moe.top_k * x.m.hidden_size * x.e


def forward_gemm_delta(x) -> float:
    """Seconds of one forward of a MoE layer's GEMMs beyond the dense layer's: the experts',
    the router's and the shared expert's in place of the dense MLP's."""
    m, lay, tok = x.m, x.lay, x.tokens
    fc1, f, h = act.fc1_factor(m), m.ffn_hidden_size, m.hidden_size
    # the experts, the shared expert and the dense MLP they replace are linear layers (FP8's
    # peak under Job.fp8); the router stays in the model precision
    peak, half = x.linear_peak, x.c.gemm_half_dim
    dense = (gemm_seconds((tok, fc1 * f / lay.tp, h), peak, half)
             + gemm_seconds((tok, h, f / lay.tp), peak, half))
    # the busiest rank's rows per expert (Constants.moe_imbalance times the balanced share)
    rows = tok / lay.tp * m.moe.top_k * lay.ep / m.moe.num_experts * x.c.moe_imbalance
    fe = moe.expert_ffn(m)
    t = expert_tp(lay, x.spec.framework)  # t times the rows at 1/t the width
    experts = m.moe.num_experts // lay.ep * (gemm_seconds((t * rows, fc1 * fe / t, h), peak, half)
                                         + gemm_seconds((t * rows, h, fe / t), peak, half))
    router = gemm_seconds((tok / lay.tp, m.moe.num_experts, h), x.peak, half)
    fs = moe.shared_ffn(m)  # the shared expert: a dense MLP of width fs, split over TP
    shared = (gemm_seconds((tok, fc1 * fs / lay.tp, h), peak, half)
              + gemm_seconds((tok, h, fs / lay.tp), peak, half)) if fs else 0.0
    return experts + router + shared - dense


def layer_delta_features(x) -> np.ndarray:
    """One MoE layer's step-time features beyond a dense layer's (x: timing._Ctx): the experts'
    and router's GEMMs in place of the dense MLP's, forward and backward; the four all-to-alls
    and the permutation copies; under full recompute the forward's share once more (its GEMMs,
    copies and two all-to-alls), as timing.layer_features replays a dense layer's."""
    m, lay = x.m, x.lay
    out = np.zeros(len(FEATURES))
    replay = lay.recompute == "full"
    passes = 4 if replay else 3  # the forward, the backward's two, and the replay
    calls = 6 if replay else 4  # dispatch and combine: forward, backward, and the replay
    t = expert_tp(lay, x.spec.framework)
    out[GEMM] = passes * forward_gemm_delta(x)
    out[MEM] = passes * 4 * all_to_all_bytes(x) / x.hbm
    if x.job.fp8:  # the experts' casts in place of the dense MLP's (timing.layer_features)
        dx, dy = io_delta(m, lay, x.spec.framework)
        out[MEM] += fp8.CAST_BYTES_PER_ELEMENT * ((1 + replay) * dx + dy) / x.hbm
    if lay.ep > 1:
        link = x.spec.link(lay.ep, lay.tp * lay.cp)
        x.collective(out, (lay.ep - 1) / lay.ep * all_to_all_bytes(x) * x.c.moe_imbalance,
                     link, calls=calls)
    if t > 1:  # the received rows all-gathered over TP, the output reduce-scattered
        x.collective(out, (t - 1) * all_to_all_bytes(x) * x.c.moe_imbalance, x.tp_link,
                     calls=calls)
    return out


def split_reduction(reduce, x, sp: StageParams, first_or_last: bool, window_s: float = 0.0,
                    layers: int = 1) -> np.ndarray:
    """timing.reduction_features (`reduce`) for a stage holding experts: its dense parameters
    reduced and stepped over dp x cp, its experts over the expert-data-parallel group
    (expert_dp), whose ranks are spaced EP x expert TP apart in the stage's rank order (priced
    through a layout of that group: expert_dp replicas of EP x expert TP ranks); the experts
    are the stage's share of the model's (stage_delta_features). Megatron's engines hold 1/t
    of each (expert_share)."""
    m, lay = x.m, x.lay
    n_exp = expert_params(m, 0, m.num_layers, lay.ep) * sp.layers // m.num_layers
    dense = dataclasses.replace(sp, transformer=sp.transformer - n_exp)
    edp = copy.copy(x)
    group = expert_dp(lay, x.spec.framework)
    edp.lay = dataclasses.replace(lay, dp=group, cp=1,
                                  tp=lay.tp * lay.zero_dp // group)
    held = n_exp * expert_share(lay, x.spec.framework)
    return (reduce(x, dense, first_or_last, window_s, layers)
            + reduce(edp, StageParams(sp.layers, held, 0, 0, 0, 0), False, window_s, layers))


def reducer(reduce, m):
    """timing.reduction_features (`reduce`) as a stage of model m runs it: split_reduction's
    for a model with experts."""
    return functools.partial(split_reduction, reduce) if m.moe.num_experts else reduce


def stage_moe_share(m, layers: int, moe_layers: Optional[int] = None) -> float:
    """The MoE layers a stage of `layers` holds: `moe_layers` where the caller counted the
    stage's own (stage_moe_layers; timing.stage_keys does), else the model's share of them."""
    if moe_layers is not None:
        return float(moe_layers)
    return moe.moe_layers(m) * layers / m.num_layers


def stage_delta_features(x, layers: int, moe_layers: Optional[int] = None) -> np.ndarray:
    """layer_delta_features for the MoE layers among a stage's `layers` (stage_moe_share)."""
    m = x.m
    if not m.moe.num_experts or not layers:
        return np.zeros(len(FEATURES))
    return stage_moe_share(m, layers, moe_layers) * layer_delta_features(x)
