"""Worker for the context-parallel (Ulysses) equivalence tests, run under torchrun (or alone for
the one-rank reference). In one launch it

- checks every parameter's gradient of one forward/backward under each context-parallel degree
  the world allows (tensor parallel 1) against the same model on one rank in this process
  (`grads/cp<C>/<flavour>`: the worst relative difference over the parameters);
- trains each requested layout x flavour 5 steps, the LLAMA_ONLY layouts in Llama alone
  (`<layout>/<flavour>`: losses, the global gradient norms from metrics.jsonl, and the
  validation loss after step 5);
- for each --sources layout, trains 10 steps in place (`<src>@10/<flavour>`) and, in a second
  run, 5 steps saved; each --continue pair `<src>><dst>` continues src's checkpoint to step 10
  in dst (`<src>><dst>/<flavour>`: the losses of steps 6-10);
- chains over more hops, each of 5 steps, toward a total T: `--in-place single@15` trains 15
  steps in place, `--saved ring_cp4@15` saves step 5 of a 15-step run, and `--continue
  ring_cp4>cp2@15` (steps 6-10, saved) then, in a later launch, `ring_cp4>cp2>single@15`
  (steps 11-15) continue it, each from the hop before.

    torchrun --nproc_per_node 4 tests/support/context_parallel_worker.py --out r.json \\
        --layouts cp4,cp2tp2 --grads --workdir /tmp/w
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import torch
import torch.distributed as dist

from megatron.base.records import StepRecord, read_metrics
from megatron.base.rundir import RunDir
from megatron.config import load_config
from megatron.training.loop import train

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, when run by path
from worker_exit import exit_after, groups_ended  # noqa: E402
from paths import TINY  # noqa: E402
# GPT-2 and Llama, and the layouts' settings: one home
from run_layouts import DOCS, DOCS_POS, FLAVOURS, MASKED, QK_NORM  # noqa: E402

COMMON = ["training.precision=fp32", "training.global_batch_size=8", "training.eval_interval=5",
          "training.micro_batch_size=2", "training.tensorboard=false", "training.clip_grad=1.0",
          "model.hidden_dropout=0.0", "model.attention_dropout=0.0", "model.attention_backend=sdpa",
          "optimizer.lr=0.003", "optimizer.lr_warmup_iters=2"]
# FLAVOURS["llama"] has two key/value heads: fewer than CP4's degree, and than CP2 x TP2's per
# TP rank (1 < 2), so their replication over the group is exercised.


def _cp(n):
    return [f"parallel.context_parallel_size={n}"]


LAYOUTS = {
    "single": [],
    "dp2": ["parallel.zero_stage=0"],
    "cp2": _cp(2) + ["parallel.zero_stage=0"],
    "cp4": _cp(4) + ["parallel.zero_stage=0"],
    # ZeRO-1 where TP is in the group: DeepSpeed then reports the global gradient norm, which
    # the test holds to one rank's (its ZeRO-0 path reports none); CP2 and CP4 keep ZeRO-0
    # and have every parameter's gradient compared instead
    "cp2tp2": _cp(2) + ["parallel.tensor_parallel_size=2"],
    # ZeRO-1 as the other pipeline equivalence tests: PP2 with ZeRO-0 departs from one rank by
    # ~1e-5 at step 3 without context parallelism too (clipping under DeepSpeed's pipeline).
    "cp2pp2": _cp(2) + ["parallel.pipeline_parallel_size=2"],
    "cp2dp2_zero1": _cp(2) + ["parallel.zero_stage=1"],
    "cp2dp2_zero2": _cp(2) + ["parallel.zero_stage=2"],
    "cp2dp2_zero3": _cp(2) + ["parallel.zero_stage=3"],
    "cp2tp2_sp": _cp(2) + ["parallel.tensor_parallel_size=2", "parallel.sequence_parallel=true"],
    "cp2tp2_recompute_selective": _cp(2) + ["parallel.tensor_parallel_size=2",
                                            "training.activation_checkpointing=selective",
                                            "model.attention_backend=math"],
    "cp2_recompute_full": _cp(2) + ["training.activation_checkpointing=full"],
    "tp2pp2": ["parallel.tensor_parallel_size=2", "parallel.pipeline_parallel_size=2"],
    "cp2_bf16": _cp(2) + ["training.precision=bf16", "parallel.zero_stage=1"],
    # data.eod_mask_loss (run_layouts.MASKED): the ranks hold different counts of counted
    # labels (model/gpt.counted_mean); Ulysses and the ring's load-balanced halves
    "single_masked": MASKED,
    "cp2_masked": _cp(2) + ["parallel.zero_stage=0"] + MASKED,
    "cp2_ring_masked": _cp(2) + ["parallel.context_parallel_algo=ring",
                                 "parallel.zero_stage=0"] + MASKED,
    # data.reset_attention_mask under Ulysses: the mask of the whole sequence on every rank
    "single_docs": DOCS,
    "cp2_docs": _cp(2) + ["parallel.zero_stage=0"] + DOCS,
    # and each rank's share of the positions from its documents' starts
    "single_docs_pos": DOCS_POS,
    "cp2_docs_pos": _cp(2) + ["parallel.zero_stage=0"] + DOCS_POS,
    # model.attention.qk_norm: each rank's tokens normalised before Ulysses' exchange and the ring's
    "single_qk_norm": QK_NORM,
    "cp2_qk_norm": _cp(2) + ["parallel.zero_stage=0"] + QK_NORM,
    "cp2_ring_qk_norm": _cp(2) + ["parallel.context_parallel_algo=ring",
                                  "parallel.zero_stage=0"] + QK_NORM,
}

# Trained in the Llama flavour alone (rotary positions, key/value heads fewer than the ranks):
# the settings that do not touch what the flavours differ in (the labels counted, the documents'
# masks, q/k norms, recomputation, ZeRO's group, SP's shards), whose GPT-2 paths are held to one
# rank without context parallelism by test_training_equivalence.py; CP itself, CP x TP's heads
# and CP x PP (GPT-2's embedding tied across the stages) and the positions from the documents'
# starts train in both. ring_attention_worker.py adds its own.
LLAMA_ONLY = {"cp2_recompute_full", "cp2_masked", "cp2_ring_masked", "cp2_docs", "cp2_qk_norm",
              "cp2_ring_qk_norm", "cp2dp2_zero1", "cp2dp2_zero2", "cp2dp2_zero3", "cp2tp2_sp",
              "cp2tp2_recompute_selective"}


def _train(layout, flavour, run_dir, extra):
    cfg = load_config(TINY, COMMON + FLAVOURS[flavour] + LAYOUTS[layout] + extra
                      + [f"run.dir={run_dir}"])
    summary = train(cfg)
    steps = [r for r in read_metrics(RunDir(run_dir).metrics) if isinstance(r, StepRecord)]
    return summary.losses, [r.grad_norm for r in steps], summary.valid_losses


HOP = 5  # steps per hop of a chain


def _total(spec):
    """`name@T` -> (name, T, its directory suffix); T is 10 when not given."""
    name, _, total = spec.partition("@")
    total = int(total or 10)
    return name, total, "" if total == 10 else f"@{total}"


def _in_place(spec, flavour, workdir):
    """`<layout>[@T]`: T steps of layout in place (the losses)."""
    src, total, tag = _total(spec)
    return _train(src, flavour, os.path.join(workdir, f"{src}-in-place{tag}-{flavour}"),
                  [f"training.train_iters={total}"])[0]


def _saved(spec, flavour, workdir):
    """`<layout>[@T]`: a T-step run of layout, saved at step 5 (the losses of steps 1-5)."""
    src, total, tag = _total(spec)
    return _train(src, flavour, os.path.join(workdir, f"{src}-saved{tag}-{flavour}"),
                  [f"training.train_iters={total}", f"training.exit_interval={HOP}",
                   "training.save=true"])[0]


def _source(src, flavour, workdir):
    """10 steps of src in place (`<src>@10`), and a second run of it saved at step 5."""
    losses = _in_place(src, flavour, workdir)
    _saved(src, flavour, workdir)
    return losses


def _chain_dir(chain, tag, flavour, workdir):
    return os.path.join(workdir, f"{chain.replace('>', '-to-')}{tag}-{flavour}")


def _continue(spec, flavour, workdir):
    """`a>b[@T]`: a's checkpoint of step 5 (written by _saved, in this launch or an earlier one)
    continued in b to step 10 (the losses of steps 6-10); `a>b>c[@T]` continues a>b's checkpoint
    of step 10 in c to step 15, and so on. A hop that ends before T saves its last step."""
    chain, total, tag = _total(spec)
    hops = chain.split(">")
    before = ">".join(hops[:-1])
    if len(hops) == 2:
        saved = os.path.join(workdir, f"{before}-saved{tag}-{flavour}", "checkpoints")
    else:
        saved = os.path.join(_chain_dir(before, tag, flavour, workdir), "checkpoints")
    stop = HOP * len(hops)
    extra = [f"training.train_iters={total}", f"training.load={saved}"]
    if stop < total:
        extra += [f"training.exit_interval={stop}", "training.save=true"]
    return _train(hops[-1], flavour, _chain_dir(chain, tag, flavour, workdir), extra)[0]


def _grad_check(flavour, cp):
    """Worst relative difference of any parameter's gradient (one micro-batch, averaged over
    the context-parallel group) from one rank's."""
    from megatron.model import build_model
    from megatron.parallel.state import ParallelState
    cfg = load_config(TINY, COMMON + FLAVOURS[flavour] + _cp(cp))
    state = ParallelState.build(1, 1, cp=cp)
    vocab = 512
    torch.manual_seed(0)
    tokens = torch.randint(0, vocab, (2, cfg.model.seq_length + 1))
    x, y = tokens[:, :-1], tokens[:, 1:]
    ref = build_model(cfg, ParallelState.single(), vocab)
    ref(x, y).backward()
    model = build_model(cfg, state, vocab)
    model(x, y).backward()
    worst = 0.0
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        g = p.grad.clone()
        dist.all_reduce(g, group=state.dp_cp_group)
        g /= state.dp_cp
        worst = max(worst, float((g - q.grad).norm() / q.grad.norm().clamp_min(1e-30)))
    return worst


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--layouts", default="")
    p.add_argument("--sources", default="", help="layouts whose checkpoints others continue")
    p.add_argument("--continue", dest="pairs", default="", help="src>dst[>...][@T],...")
    p.add_argument("--in-place", default="", help="layout@T,...: T steps in place")
    p.add_argument("--saved", default="", help="layout@T,...: a T-step run saved at step 5")
    p.add_argument("--grads", action="store_true")
    p.add_argument("--flavours", default="gpt2,llama")
    p.add_argument("--workdir", required=True, help="shared by all ranks (run directories)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    results = {}
    for flavour in args.flavours.split(","):
        for layout in filter(None, args.layouts.split(",")):
            if flavour != "llama" and layout in LLAMA_ONLY:
                continue
            run_dir = os.path.join(args.workdir, f"{layout}-{flavour}")
            losses, norms, valid = _train(layout, flavour, run_dir, ["training.train_iters=5"])
            results[f"{layout}/{flavour}"] = {"losses": losses, "grad_norms": norms,
                                              "valid": valid}
        for src in filter(None, args.sources.split(",")):
            results[f"{src}@10/{flavour}"] = {"losses": _source(src, flavour, args.workdir)}
        for spec in filter(None, args.in_place.split(",")):
            results[f"{spec}/{flavour}"] = {"losses": _in_place(spec, flavour, args.workdir)}
        for spec in filter(None, args.saved.split(",")):
            results[f"{spec}:saved/{flavour}"] = {"losses": _saved(spec, flavour, args.workdir)}
        for pair in filter(None, args.pairs.split(",")):
            results[f"{pair}/{flavour}"] = {"losses": _continue(pair, flavour, args.workdir)}
        if args.grads and world > 1:
            for cp in (c for c in (2, 4) if world % c == 0):
                with groups_ended():  # the check's own ParallelState
                    results[f"grads/cp{cp}/{flavour}"] = _grad_check(flavour, cp)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    exit_after(main)
