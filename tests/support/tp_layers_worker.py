"""Worker for test_parallel_tp_layers.py: run under one `torchrun --nproc_per_node 4` (or 2)
launch, it runs every tensor-parallel check in this process and writes {check: {"ok", "detail"}}
for its rank to OUT_DIR/rank<R>.json.

Each check compares the sharded computation against the unsharded reference computed locally
(every rank draws the same full inputs and weights), forward and backward: input gradients, and
each rank's weight gradient against the matching slice of the reference's. Checks never raise
before their collectives are done, so one failing check does not desynchronise the ranks.

    python -m torch.distributed.run --nproc_per_node 4 tests/support/tp_layers_worker.py OUT
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import traceback
from typing import Callable, Dict, List, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from megatron.parallel import mappings as M
from megatron.parallel.cross_entropy import vocab_parallel_cross_entropy
from megatron.parallel import layers as L
from megatron.parallel.layers import (ColumnParallelLinear, RowParallelLinear,
                                      VocabParallelEmbedding, WeightGradStore,
                                      defer_weight_grads, full_normal, parallel_lm_logits,
                                      shard)
from megatron.parallel.state import ParallelState

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tp_check_support import (B, IN, OUT, VOCAB, S, Report, leaf, randn,  # noqa: E402
                              ref_linear, seq_chunk)
from tp_checks_state import (GRIDS_2, GRIDS_4, check_grid, check_recompute,  # noqa: E402
                             check_rng_tracker)


def check_column(st: ParallelState, *, gather_output=False, stride=1, skip_bias_add=False,
                 sequence_parallel=False) -> None:
    rep, r, t = Report(), st.tp_rank, st.tp
    w_full, b_full = full_normal((OUT, IN), 0.5, 11), randn(OUT, seed=12)
    x, grad = randn(S, B, IN, seed=1), randn(S, B, OUT, seed=2)
    y_ref, gx_ref, gw_ref, gb_ref = ref_linear(x, w_full, b_full, grad)
    layer = ColumnParallelLinear(IN, OUT, st, gather_output=gather_output, stride=stride,
                                 skip_bias_add=skip_bias_add, sequence_parallel=sequence_parallel,
                                 init_std=0.5, init_seed=11)
    rep.close("initial weight shard", layer.weight, shard(w_full, 0, r, t, stride))
    with torch.no_grad():
        layer.bias.copy_(shard(b_full, 0, r, t, stride))
    x_in = leaf(seq_chunk(x, st) if sequence_parallel else x)
    out = layer(x_in)
    if skip_bias_add:
        y, bias = out
        rep.true("skip_bias_add must return the layer's own bias", bias is layer.bias)
        rep.close("output without bias", y, shard(F.linear(x, w_full), -1, r, t, stride))
        y = y + bias
    else:
        y = out
    if gather_output:
        rep.close("gathered output", y, y_ref)
        y.backward(grad)
    else:
        rep.close("output slice", y, shard(y_ref, -1, r, t, stride))
        y.backward(shard(grad, -1, r, t, stride))
    rep.close("input grad", x_in.grad, seq_chunk(gx_ref, st) if sequence_parallel else gx_ref)
    rep.close("weight grad slice", layer.weight.grad, shard(gw_ref, 0, r, t, stride))
    rep.close("bias grad slice", layer.bias.grad, shard(gb_ref, 0, r, t, stride))
    rep.raise_if_failed()


def _saved_elements(fn):
    """fn()'s result and the elements autograd saved for its backward, parameters left out."""
    saved = []

    def pack(t):
        if not isinstance(t, torch.nn.Parameter):
            saved.append(t.numel())
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(saved)


def check_column_overlap(st: ParallelState, *, sequence_parallel=False, deferred=False) -> None:
    """The column-parallel layer's fused backward (layers._ColumnLinear): with overlap the
    input gradient's collective starts before the weight gradient is computed (or deferred) and
    is waited for after it, without overlap before it; either way every gradient has the bits
    of the unfused path (copy_to_tp_region or the SP all-gather, then F.linear under autograd),
    and under SP the layer keeps only this rank's shard of its input (s/t of the tokens: the
    backward gathers it again), where the unfused path kept the gathered s."""
    rep, r, t = Report(), st.tp_rank, st.tp
    x, grad = randn(S, B, IN, seed=41), randn(S, B, OUT, seed=42)
    x_local = seq_chunk(x, st) if sequence_parallel else x
    # the unfused path on the same weights
    ref = ColumnParallelLinear(IN, OUT, st, init_std=0.5, init_seed=43)
    w_ref, b_ref = leaf(ref.weight), leaf(ref.bias)
    x_ref = leaf(x_local)

    def unfused():
        mapped = (M.gather_from_sequence_parallel_region(x_ref, st.tp_group) if sequence_parallel
                  else M.copy_to_tp_region(x_ref, st.tp_group))
        return F.linear(mapped, w_ref, b_ref)
    y_ref, kept_ref = _saved_elements(unfused)
    y_ref.backward(shard(grad, -1, r, t))
    want = (x_ref.grad, w_ref.grad, b_ref.grad)
    for overlap in (False, True):
        layer = ColumnParallelLinear(IN, OUT, st, sequence_parallel=sequence_parallel,
                                     init_std=0.5, init_seed=43, overlap_backward=overlap)
        store = WeightGradStore()
        if deferred:
            defer_weight_grads(layer, store)
            store.open()
        x_in = leaf(x_local)
        L._TRACE = []
        try:
            y, kept = _saved_elements(lambda: layer(x_in))
            y.backward(shard(grad, -1, r, t))
            trace = L._TRACE
        finally:
            L._TRACE = None
        rep.true(f"output bits (overlap={overlap})", torch.equal(y, y_ref))
        rep.true(f"kept {kept} elements for backward, want {x_local.numel()} (overlap="
                 f"{overlap}; the unfused path kept {kept_ref})", kept == x_local.numel())
        if deferred:
            rep.true(f"weight gradient left in the store (overlap={overlap})",
                     layer.weight.grad is None)
            store.seal()
            store.run(0)
        order = ["start", "weight", "wait"] if overlap else ["start", "wait", "weight"]
        rep.true(f"backward order with overlap={overlap}: {trace}", trace == order)
        got = (x_in.grad, layer.weight.grad, layer.bias.grad)
        for label, g, w in zip(("input", "weight", "bias"), got, want):
            rep.true(f"{label} gradient bits differ from the unfused path (overlap={overlap})",
                     g is not None and w is not None and torch.equal(g, w))
    rep.raise_if_failed()


def check_row(st: ParallelState, *, sequence_parallel=False) -> None:
    rep, r, t = Report(), st.tp_rank, st.tp
    w_full, b_full = full_normal((OUT, IN), 0.5, 21, dim=1), randn(OUT, seed=22)
    x, grad = randn(S, B, IN, seed=3), randn(S, B, OUT, seed=4)
    y_ref, gx_ref, gw_ref, gb_ref = ref_linear(x, w_full, b_full, grad)
    layer = RowParallelLinear(IN, OUT, st, sequence_parallel=sequence_parallel, init_std=0.5,
                              init_seed=21)
    rep.close("initial weight shard", layer.weight, shard(w_full, 1, r, t))
    with torch.no_grad():
        layer.bias.copy_(b_full)
    x_in = leaf(shard(x, -1, r, t))  # input_is_parallel: this rank's slice of the features
    y = layer(x_in)
    if sequence_parallel:
        rep.close("reduce-scattered output", y, seq_chunk(y_ref, st))
        y.backward(seq_chunk(grad, st))
    else:
        rep.close("all-reduced output", y, y_ref)
        y.backward(grad)
    rep.close("input grad slice", x_in.grad, shard(gx_ref, -1, r, t))
    rep.close("weight grad slice", layer.weight.grad, shard(gw_ref, 1, r, t))
    rep.close("bias grad (replicated, summed over sequence shards)", layer.bias.grad, gb_ref)
    rep.raise_if_failed()


def check_vocab_embedding(st: ParallelState, *, sequence_parallel=False) -> None:
    rep, r, t = Report(), st.tp_rank, st.tp
    ids = torch.randint(0, VOCAB, (S, B), generator=torch.Generator().manual_seed(5))
    ids[0, 0], ids[-1, -1] = 0, VOCAB - 1  # both ends of the vocabulary
    grad = randn(S, B, IN, seed=6)
    w_ref = leaf(full_normal((VOCAB, IN), 0.5, 31))
    y_ref = F.embedding(ids, w_ref)
    y_ref.backward(grad)
    emb = VocabParallelEmbedding(VOCAB, IN, st, init_std=0.5, init_seed=31)
    rep.true("vocab range", (emb.vocab_start, emb.vocab_end) ==
             (r * VOCAB // t, (r + 1) * VOCAB // t))
    partial = emb.partial(ids)
    if sequence_parallel:
        y = M.reduce_scatter_to_sequence_parallel_region(partial, st.tp_group)
        rep.close("reduce-scattered lookup", y, seq_chunk(y_ref, st))
        y.backward(seq_chunk(grad, st))
    else:
        y = M.reduce_from_tp_region(partial, st.tp_group)
        rep.close("all-reduced lookup", y, y_ref)
        y.backward(grad)
    rep.close("weight grad rows", emb.weight.grad, shard(w_ref.grad, 0, r, t))
    rep.raise_if_failed()


def check_lm_cross_entropy(st: ParallelState, *, sequence_parallel=False, scale=1.0) -> None:
    """parallel_lm_logits + vocab_parallel_cross_entropy vs torch cross_entropy on full logits;
    `scale` pushes logits large enough that a missing max-subtraction would overflow exp."""
    rep, r, t = Report(), st.tp_rank, st.tp
    x = randn(S, B, IN, seed=7) * scale
    target = torch.randint(0, VOCAB, (S, B), generator=torch.Generator().manual_seed(8))
    target[0, 0], target[-1, -1] = 0, VOCAB - 1
    token_weight = randn(S, B, seed=9)  # a non-uniform upstream gradient per token
    w_full = full_normal((VOCAB, IN), 0.5, 41)
    x_ref, w_ref = leaf(x), leaf(w_full)
    logits_ref = F.linear(x_ref, w_ref)
    loss_ref = F.cross_entropy(logits_ref.reshape(-1, VOCAB), target.reshape(-1),
                               reduction="none").view(S, B)
    (loss_ref * token_weight).sum().backward()
    w = leaf(shard(w_full, 0, r, t))
    x_in = leaf(seq_chunk(x, st) if sequence_parallel else x)
    logits = parallel_lm_logits(x_in, w, st, sequence_parallel)
    rep.close("logits vocab slice", logits, shard(logits_ref, -1, r, t), atol=1e-5 * scale)
    loss = vocab_parallel_cross_entropy(logits, target, st)
    rep.close("per-token loss", loss, loss_ref, atol=1e-5 * scale)
    (loss * token_weight).sum().backward()
    rep.close("hidden grad", x_in.grad,
              seq_chunk(x_ref.grad, st) if sequence_parallel else x_ref.grad)
    rep.close("weight grad rows", w.grad, shard(w_ref.grad, 0, r, t), atol=1e-6 * scale)
    rep.raise_if_failed()


# -------------------------------------------------------------------------------- mappings


def _mapping_case(st, fn, x_local, grad_local, want_out, want_grad) -> Report:
    rep = Report()
    x = leaf(x_local)
    y = fn(x, st.tp_group)
    rep.close("forward", y, want_out)
    y.backward(grad_local)
    rep.close("backward", x.grad, want_grad)
    return rep


def check_mapping(st: ParallelState, name: str) -> None:
    """Every mapping's forward and backward, as its docstring states, with inputs and upstream
    gradients that differ per rank (rank-dependent offsets) so a wrong reduction shows."""
    r, t = st.tp_rank, st.tp
    full = randn(S, B, 4 * t, seed=50)
    per_rank = [randn(S, B, 4 * t, seed=60 + i) for i in range(t)]  # x_r (or g_r) of rank i
    mine, total = per_rank[r], sum(per_rank)
    fn = getattr(M, name)
    cases = {
        # forward identity, backward all-reduce
        "copy_to_tp_region": (full, mine, full, total),
        # forward all-reduce, backward identity
        "reduce_from_tp_region": (mine, full, total, full),
        # forward keep the last-dim slice, backward all-gather the last dim
        "scatter_to_tp_region": (full, shard(full, -1, r, t), shard(full, -1, r, t), full),
        # forward all-gather the last dim, backward keep the slice
        "gather_from_tp_region": (shard(full, -1, r, t), mine, full, shard(mine, -1, r, t)),
        # forward keep the dim-0 slice, backward all-gather dim 0
        "scatter_to_sequence_parallel_region": (full, seq_chunk(full, st), seq_chunk(full, st),
                                                full),
        # forward all-gather dim 0, backward reduce-scatter dim 0
        "gather_from_sequence_parallel_region": (seq_chunk(full, st), mine, full,
                                                 seq_chunk(total, st)),
        # forward reduce-scatter dim 0, backward all-gather dim 0
        "reduce_scatter_to_sequence_parallel_region": (mine, seq_chunk(full, st),
                                                       seq_chunk(total, st), full),
    }
    x_local, grad_local, want_out, want_grad = cases[name]
    rep = _mapping_case(st, fn, x_local, grad_local, want_out, want_grad)
    if name == "reduce_from_tp_region":
        # The hot path reduces in place on a fresh contiguous matmul output; a non-contiguous
        # input takes the copying path. Both must give the same result.
        y = fn(leaf(mine).transpose(0, 1), st.tp_group)
        rep.close("forward (non-contiguous input)", y, total.transpose(0, 1))
    rep.raise_if_failed()


MAPPINGS = ["copy_to_tp_region", "reduce_from_tp_region", "scatter_to_tp_region",
            "gather_from_tp_region", "scatter_to_sequence_parallel_region",
            "gather_from_sequence_parallel_region", "reduce_scatter_to_sequence_parallel_region"]


# ------------------------------------------------------------------------------ randomness


# ---------------------------------------------------------------------------------- registry


def checks(world: int) -> List[Tuple[str, str, Callable[[ParallelState], None]]]:
    """(name, layout, fn) in the order every rank runs them; layer checks run once per TP size
    the world allows (TP=2 inside a data-parallel grid, and TP=world)."""
    out = []
    tps = {"tp2dp2": 2, "tp4": 4} if world == 4 else {"tp2": 2}
    for layout, t in tps.items():
        def add(label, fn, **kw):
            out.append((f"{label}[tp={t}]", layout, lambda st, fn=fn, kw=kw: fn(st, **kw)))
        add("column_parallel.scatter_output", check_column)
        add("column_parallel.gather_output", check_column, gather_output=True)
        add("column_parallel.stride2", check_column, stride=2)
        add("column_parallel.skip_bias_add", check_column, skip_bias_add=True)
        add("column_parallel.sequence_parallel", check_column, sequence_parallel=True)
        add("column_parallel.overlap", check_column_overlap)
        add("column_parallel.overlap.sequence_parallel", check_column_overlap,
            sequence_parallel=True)
        add("column_parallel.overlap.deferred", check_column_overlap, deferred=True)
        add("row_parallel.all_reduce", check_row)
        add("row_parallel.sequence_parallel", check_row, sequence_parallel=True)
        add("vocab_embedding.all_reduce", check_vocab_embedding)
        add("vocab_embedding.sequence_parallel", check_vocab_embedding, sequence_parallel=True)
        add("lm_logits_cross_entropy", check_lm_cross_entropy)
        add("lm_logits_cross_entropy.sequence_parallel", check_lm_cross_entropy,
            sequence_parallel=True)
        add("lm_logits_cross_entropy.large_logits", check_lm_cross_entropy, scale=100.0)
        for name in MAPPINGS:
            add(f"mapping.{name}", check_mapping, name=name)
        add("rng_tracker", check_rng_tracker)
        add("recompute", check_recompute)
        add("recompute.sequence_parallel", check_recompute, sequence_parallel=True)
    out.append(("recompute[single]", "single", lambda st: check_recompute(st)))
    for layout, (_, _, expect) in (GRIDS_4 if world == 4 else GRIDS_2).items():
        out.append((f"grid[{layout}]", layout, lambda st, e=expect: check_grid(st, e)))
    if world == 4:
        out.append(("rng_tracker[tp2pp2]", "tp2pp2", check_rng_tracker))
    return out


def build_states(world: int) -> Dict[str, ParallelState]:
    """Every rank builds every layout in the same order (new_group is collective)."""
    states = {"single": ParallelState.single()}
    for layout, (tp, pp, _) in (GRIDS_4 if world == 4 else GRIDS_2).items():
        states[layout] = ParallelState.build(tp, pp)
    return states


def main() -> int:
    out_dir = sys.argv[1]
    torch.set_num_threads(1)  # 4 ranks share 2 cores
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    states = build_states(world)
    results = {}
    for name, layout, fn in checks(world):
        try:
            fn(states[layout])
            results[name] = {"ok": True, "detail": ""}
        except Exception as e:  # recorded per check so one failure localizes
            detail = str(e) if isinstance(e, AssertionError) else traceback.format_exc()
            results[name] = {"ok": False, "detail": f"rank {rank}: {detail}"}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
