"""Worker for the ring / all-gather / hybrid context-parallel tests (parallel.context_parallel_algo),
run under torchrun (or alone for the one-rank reference). It is context_parallel_worker.py
(same common settings, flavours, training in process, checkpoint sources and continuations)
with these layouts added, and a gradient check that builds the algorithm's layout:
`grads/<algo>_cp<C>/<flavour>` is the worst relative difference of any parameter's gradient
(one micro-batch, averaged over the context-parallel group) from one rank's.

    torchrun --nproc_per_node 4 tests/support/ring_attention_worker.py --out r.json \\
        --layouts ring_cp4,hybrid_u2r2 --grads --workdir /tmp/w
"""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, when run by path
import context_parallel_worker as cpw  # noqa: E402
from worker_exit import exit_after, groups_ended  # noqa: E402


def _algo(algo, cp, *more, zero=0):
    return [f"parallel.context_parallel_size={cp}", f"parallel.context_parallel_algo={algo}",
            f"parallel.zero_stage={zero}", *more]


POS = cpw.MASKED + ["data.reset_position_ids=true"]
# model.attention.sliding_window on the first layer, the whole sequence on the second: 12 keys
# of the 64, so blocks of 16 (CP 2) are cut and of 8 (CP 4) some are skipped whole
WINDOW = ["model.attention.sliding_window=12", "model.attention.sliding_window_pattern=2"]
RING_LAYOUTS = {
    "ring_cp2": _algo("ring", 2),
    "allgather_cp2": _algo("allgather", 2),
    "ring_cp4": _algo("ring", 4),
    "allgather_cp4": _algo("allgather", 4),
    "hybrid_u2r2": _algo("hybrid", 4, "parallel.ulysses_degree=2"),
    # ZeRO-1 where TP is in the group: DeepSpeed then reports the global gradient norm
    "ring_cp2tp2": _algo("ring", 2, "parallel.tensor_parallel_size=2", zero=1),
    # sequence parallelism: each TP rank's 1/t of the ring rank's sequence; and full recompute
    "ring_cp2tp2_sp": _algo("ring", 2, "parallel.tensor_parallel_size=2",
                            "parallel.sequence_parallel=true", zero=1),
    "ring_cp2tp2_sp_recompute": _algo("ring", 2, "parallel.tensor_parallel_size=2",
                                      "parallel.sequence_parallel=true",
                                      "training.activation_checkpointing=full", zero=1),
    "ring_cp2dp2_zero1": _algo("ring", 2, zero=1),
    "ring_cp2dp2_zero3": _algo("ring", 2, zero=3),
    # pipeline stages (ZeRO-1, as the other pipeline equivalence tests), 1F1B and ZB-H1 (its
    # deferred weight gradients beside the ring's explicit backward), and Ulysses under ZB-H1
    "ring_cp2pp2": _algo("ring", 2, "parallel.pipeline_parallel_size=2", zero=1),
    "ring_cp2pp2_zbh1": _algo("ring", 2, "parallel.pipeline_parallel_size=2",
                              "parallel.pipeline_schedule=zbh1", zero=1),
    "ulysses_cp2pp2_zbh1": _algo("ulysses", 2, "parallel.pipeline_parallel_size=2",
                                 "parallel.pipeline_schedule=zbh1", zero=1),
    # the project's chunk executor: interleaved 1F1B and ZB-V, two chunks per rank
    "ring_cp2pp2v2": _algo("ring", 2, "parallel.pipeline_parallel_size=2",
                           "parallel.pipeline_schedule=interleaved",
                           "parallel.virtual_pipeline_size=2", zero=1),
    "ring_cp2pp2_zbv": _algo("ring", 2, "parallel.pipeline_parallel_size=2",
                             "parallel.pipeline_schedule=zbv", "parallel.virtual_pipeline_size=2",
                             zero=1),
    "ulysses_cp2pp2v2": _algo("ulysses", 2, "parallel.pipeline_parallel_size=2",
                              "parallel.pipeline_schedule=interleaved",
                              "parallel.virtual_pipeline_size=2", zero=1),
    # past the Ulysses cap: tiny.yaml's 4 query heads over 8 ranks (seq 64 = 16 chunks of 4)
    "ring_cp8": _algo("ring", 8),
    # data.reset_attention_mask (and reset_position_ids): each block masked by the documents
    # of the key chunk it holds, rotary at each rank's tokens' places in their documents
    "ring_cp2_docs": _algo("ring", 2) + cpw.DOCS,
    "ring_cp2_docs_pos": _algo("ring", 2) + cpw.DOCS_POS,
    # positions from each document's start, attention across them (rotary's places matter)
    "single_pos": POS,
    "ring_cp2_pos": _algo("ring", 2) + POS,
    "single_window": WINDOW,
    "ring_cp2_window": _algo("ring", 2) + WINDOW,
    "allgather_cp2_window": _algo("allgather", 2) + WINDOW,
    "ulysses_cp2_window": _algo("ulysses", 2) + WINDOW,
    "single_window_docs": WINDOW + cpw.DOCS_POS,
    "ring_cp4_window_docs": _algo("ring", 4) + WINDOW + cpw.DOCS_POS,
    # all of it on the chunk executor: ZB-V's deferred weight gradients beside the ring's
    # explicit backward, the documents sent between the V's chunks
    "ring_cp2pp2_zbv_window_docs": _algo("ring", 2, "parallel.pipeline_parallel_size=2",
                                         "parallel.pipeline_schedule=zbv",
                                         "parallel.virtual_pipeline_size=2",
                                         zero=1) + WINDOW + cpw.DOCS_POS,
    "allgather_cp2_docs_pos": _algo("allgather", 2) + cpw.DOCS_POS,
    "ring_cp4_docs_pos": _algo("ring", 4) + cpw.DOCS_POS,
    "hybrid_u2r2_docs_pos": _algo("hybrid", 4, "parallel.ulysses_degree=2") + cpw.DOCS_POS,
    # the documents sent with the activations to the ring's second stage; SP's shares
    "ring_cp2pp2_docs_pos": _algo("ring", 2, "parallel.pipeline_parallel_size=2",
                                  zero=1) + cpw.DOCS_POS,
    "ring_cp2tp2_sp_docs_pos": _algo("ring", 2, "parallel.tensor_parallel_size=2",
                                     "parallel.sequence_parallel=true", zero=1) + cpw.DOCS_POS,
}
# Added to context_parallel_worker.LLAMA_ONLY: the compositions with another axis train in the
# Llama flavour alone: rotary positions and two key/value heads (fewer than the ring's ranks)
# give the exchange the most to get wrong, and GPT-2's own paths (learned positions, biases,
# LayerNorm) are held to one rank under each axis without context parallelism by the other
# equivalence modules, and with it by the algorithms' own layouts, which train in both. The
# pipeline ones keep both: GPT-2's embedding is tied across the stages (and held twice by ZB-V's
# rank 0). Ring CP8 too: its point is more ranks than query heads (8 ranks on 2 cores, the
# costliest launch for its one layout); GPT-2's learned positions split by the ring are held at
# CP4.
RING_LLAMA_ONLY = {"ring_cp8", "ring_cp2_docs", "ring_cp2_window", "allgather_cp2_window",
                   "ulysses_cp2_window", "ring_cp2tp2", "ring_cp2tp2_sp",
                   "ring_cp2tp2_sp_recompute", "ring_cp2dp2_zero1", "ring_cp2dp2_zero3",
                   "ring_cp2pp2_zbh1", "ulysses_cp2pp2_zbh1", "ring_cp2pp2v2", "ulysses_cp2pp2v2",
                   "hybrid_u2r2_docs_pos", "ring_cp2pp2_docs_pos", "ring_cp2tp2_sp_docs_pos",
                   "ring_cp4_window_docs", "ring_cp2pp2_zbv_window_docs"}
GRAD_CHECKS = {2: [("ring", 2, 0), ("allgather", 2, 0)],
               4: [("ring", 4, 0), ("hybrid", 4, 2)],
               8: [("ring", 8, 0)]}


def _grad_check(flavour, algo, cp, u):
    from megatron.config import load_config
    from megatron.model import build_model
    from megatron.parallel.cp_layout import cp_layout_of
    from megatron.parallel.state import ParallelState
    cfg = load_config(cpw.TINY, cpw.COMMON + cpw.FLAVOURS[flavour] + _algo(algo, cp)
                      + ([f"parallel.ulysses_degree={u}"] if u else []))
    state = ParallelState.build(1, 1, cp=cp, cp_layout=cp_layout_of(cfg.parallel))
    torch.manual_seed(0)
    tokens = torch.randint(0, 512, (2, cfg.model.seq_length + 1))
    x, y = tokens[:, :-1], tokens[:, 1:]
    ref = build_model(cfg, ParallelState.single(), 512)
    ref(x, y).backward()
    model = build_model(cfg, state, 512)
    model(x, y).backward()
    worst = 0.0
    for p, q in zip(model.parameters(), ref.parameters()):
        g = p.grad.clone()
        dist.all_reduce(g, group=state.dp_cp_group)
        g /= state.dp_cp
        worst = max(worst, float((g - q.grad).norm() / q.grad.norm().clamp_min(1e-30)))
    return worst


def _grads_into(path, flavours):
    """Appends the gradient checks this world size runs to the results rank 0 wrote."""
    import json
    world = int(os.environ.get("WORLD_SIZE", "1"))
    found = {}
    for fl in flavours:
        for a, c, u in GRAD_CHECKS.get(world, []):
            with groups_ended():  # the check's own ParallelState
                found[f"grads/{a}_cp{c}/{fl}"] = _grad_check(fl, a, c, u)
    if int(os.environ.get("RANK", "0")) == 0:
        with open(path) as f:
            results = json.load(f)
        results.update(found)
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def main() -> int:
    cpw.LAYOUTS.update(RING_LAYOUTS)
    cpw.LLAMA_ONLY.update(RING_LLAMA_ONLY)
    grads = "--ring-grads" in sys.argv
    if grads:
        sys.argv.remove("--ring-grads")
    rc = cpw.main()
    if grads and rc == 0:
        out = sys.argv[sys.argv.index("--out") + 1]
        flavours = "gpt2,llama"
        if "--flavours" in sys.argv:
            flavours = sys.argv[sys.argv.index("--flavours") + 1]
        dist.barrier()
        return _grads_into(out, flavours.split(","))
    return rc


if __name__ == "__main__":
    exit_after(main)
