"""Worker for the whole-model equivalence tests: run under torchrun (or alone for the
single-process reference), trains each requested layout x flavour for a few steps in this one
process launch, and writes the per-step losses as JSON (rank 0).

    torchrun --nproc_per_node 2 tests/support/run_layouts.py --out r.json --layouts tp2,pp2
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

from megatron.base.records import read_metrics, steps
from megatron.base.rundir import RunDir
from megatron.config import load_config
from megatron.training.loop import train

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, when run by path
from worker_exit import exit_after  # noqa: E402
from paths import TINY  # noqa: E402

# fp32, no dropout, clipping active, warmup then cosine: every part of the update is exercised.
COMMON = ["training.precision=fp32", "training.train_iters=10", "training.global_batch_size=8",
          "training.micro_batch_size=2", "training.tensorboard=false", "training.clip_grad=1.0",
          "model.hidden_dropout=0.0", "model.attention_dropout=0.0", "model.attention_backend=sdpa",
          "optimizer.lr=0.003", "optimizer.lr_warmup_iters=2"]

FLAVOURS = {
    "gpt2": ["model.position_embedding_type=learned", "model.normalization=layernorm",
             "model.activation=gelu", "model.tie_embeddings=true"],
    "llama": ["model.position_embedding_type=rotary", "model.normalization=rmsnorm",
              "model.activation=swiglu", "model.num_query_groups=2",
              "model.add_bias_linear=false", "model.tie_embeddings=false"],
}

# data.eod_mask_loss with a vocabulary of 64 (about one label in 45 ignored here). The padding
# to a multiple of 32 x TP keeps 64 rows under TP 2 too (with 128 x TP, one rank has 128 rows
# and TP 2 256: other models, whose softmax spans the padding).
MASKED = ["model.vocab_size=64", "model.make_vocab_size_divisible_by=32",
          "data.eod_mask_loss=true"]
# and attention within documents (data.reset_attention_mask): sequences of 64 hold 1-2 ends
DOCS = MASKED + ["data.reset_attention_mask=true"]
# and positions from each document's start (data.reset_position_ids)
DOCS_POS = DOCS + ["data.reset_position_ids=true"]
# Qwen3's per-head query/key norm, with heads wider than hidden / heads (24, not 16) and
# Qwen2's biases on q, k and v alone (the Llama flavour has no other biases)
QK_NORM = ["model.attention.qk_norm=true", "model.attention.kv_channels=24",
           "model.attention.add_qkv_bias=true"]
LAYOUTS = {
    "single": [],
    "tp2": ["parallel.tensor_parallel_size=2"],
    "pp2": ["parallel.pipeline_parallel_size=2"],
    "tp2pp2": ["parallel.tensor_parallel_size=2", "parallel.pipeline_parallel_size=2"],
    # DeepSpeed's pipeline must send whole sequence shards (base/deepspeed_json.py)
    "tp2pp2_sp": ["parallel.tensor_parallel_size=2", "parallel.pipeline_parallel_size=2",
                  "parallel.sequence_parallel=true"],
    "tp2dp2_zero1": ["parallel.tensor_parallel_size=2", "parallel.zero_stage=1"],
    "tp2dp2_zero3_sp": ["parallel.tensor_parallel_size=2", "parallel.zero_stage=3",
                        "parallel.sequence_parallel=true"],
    "pp2dp2_zero1": ["parallel.pipeline_parallel_size=2", "parallel.zero_stage=1"],
    "dp2_zero1": ["parallel.zero_stage=1"],
    "dp2_zero2": ["parallel.zero_stage=2"],
    "dp2_zero3": ["parallel.zero_stage=3"],
    "tp2_sp": ["parallel.tensor_parallel_size=2", "parallel.sequence_parallel=true"],
    "tp2_recompute_full": ["parallel.tensor_parallel_size=2",
                           "training.activation_checkpointing=full"],
    "pp2_recompute_selective": ["parallel.pipeline_parallel_size=2", "model.attention_backend=math",
                                "training.activation_checkpointing=selective"],
    "pp2_recompute_full": ["parallel.pipeline_parallel_size=2",
                           "training.activation_checkpointing=full"],
    # Mixed precision cannot match fp32 to 1e-5; the test checks they track it loosely and learn.
    # (fp16 needs a GPU: DeepSpeed's CPU accelerator refuses it; see tests/gpu.)
    # uneven stages (config/stages.py): 1 + 3 and 3 + 1 of the 4 layers
    "pp2_first1": ["parallel.pipeline_parallel_size=2", "parallel.pipeline_first_stage_layers=1"],
    "pp2_last1": ["parallel.pipeline_parallel_size=2", "parallel.pipeline_last_stage_layers=1"],
    "pp2_first1_zbh1": ["parallel.pipeline_parallel_size=2", "parallel.pipeline_first_stage_layers=1",
                        "parallel.pipeline_schedule=zbh1"],
    # the head counted as a layer (config/stages.accounted_ends): one layer on two stages,
    # [1, 0] (the last stage the final norm and head alone), against the one-layer reference
    # (an embedding-only stage is refused under DeepSpeed's engine: test_config_stages.py)
    "single_l1": ["model.num_layers=1"],
    "pp2_loss": ["parallel.pipeline_parallel_size=2", "model.num_layers=1",
                 "parallel.pipeline_loss_as_layer=true"],
    # ZeRO-0's own clipping paths (engine/zero0_norm.py): fp32 under TP and under DeepSpeed's
    # pipeline engine, 16 bits under TP
    "tp2_zero0": ["parallel.tensor_parallel_size=2", "parallel.zero_stage=0"],
    "pp2_zero0": ["parallel.pipeline_parallel_size=2", "parallel.zero_stage=0"],
    "tp2_zero0_bf16": ["parallel.tensor_parallel_size=2", "parallel.zero_stage=0",
                       "training.precision=bf16"],
    "single_zero0_bf16": ["parallel.zero_stage=0", "training.precision=bf16"],
    # the vocabulary-parallel loss and DeepSpeed's pipeline loss count what one rank counts
    "masked": MASKED,
    "tp2_masked": ["parallel.tensor_parallel_size=2"] + MASKED,
    "pp2_masked": ["parallel.pipeline_parallel_size=2"] + MASKED,
    # and the model chunks' loss (engine/chunks.py), two a rank
    "pp2_interleaved_masked": ["parallel.pipeline_parallel_size=2",
                               "parallel.pipeline_schedule=interleaved",
                               "parallel.virtual_pipeline_size=2"] + MASKED,
    # the document mask under TP's heads with SP's gathered sequence, and the math core's
    # masked softmax recomputed (selective)
    "docs": DOCS,
    "tp2_sp_docs": ["parallel.tensor_parallel_size=2", "parallel.sequence_parallel=true"] + DOCS,
    # each SP rank's share of the learned positions, from its documents' starts
    "docs_pos": DOCS_POS,
    "tp2_sp_docs_pos": ["parallel.tensor_parallel_size=2",
                        "parallel.sequence_parallel=true"] + DOCS_POS,
    # the documents sent with the activations between pipeline stages, and held by each
    # layer's recomputation while a later micro-batch's forward runs (1F1B: two in flight)
    "pp2_docs_pos": ["parallel.pipeline_parallel_size=2"] + DOCS_POS,
    "pp2_docs_pos_recompute_full": ["parallel.pipeline_parallel_size=2",
                                    "training.activation_checkpointing=full"] + DOCS_POS,
    "pp2_docs_pos_zbh1": ["parallel.pipeline_parallel_size=2",
                          "parallel.pipeline_schedule=zbh1"] + DOCS_POS,
    # the model chunks' executor (engine/interleaved.py): interleaved 1F1B and ZB-V
    "pp2_interleaved_docs_pos": ["parallel.pipeline_parallel_size=2",
                                 "parallel.pipeline_schedule=interleaved",
                                 "parallel.virtual_pipeline_size=2"] + DOCS_POS,
    "pp2_zbv_docs_pos": ["parallel.pipeline_parallel_size=2", "parallel.pipeline_schedule=zbv",
                         "parallel.virtual_pipeline_size=2"] + DOCS_POS,
    "tp2pp2_sp_docs_pos": ["parallel.tensor_parallel_size=2", "parallel.pipeline_parallel_size=2",
                           "parallel.sequence_parallel=true"] + DOCS_POS,
    "pp2_docs_recompute_selective": ["parallel.pipeline_parallel_size=2",
                                     "training.activation_checkpointing=selective",
                                     "model.attention_backend=math"] + DOCS,
    "tp2_docs_recompute_selective": ["parallel.tensor_parallel_size=2",
                                     "training.activation_checkpointing=selective",
                                     "model.attention_backend=math"] + DOCS,
    # each TP rank normalises its own heads: the norms' gradients summed over TP, and counted
    # once in the gradient norm (DeepSpeed's ZeRO-1 and ZeRO-0's own)
    "qk_norm": QK_NORM,
    "tp2_sp_qk_norm": ["parallel.tensor_parallel_size=2", "parallel.sequence_parallel=true"]
    + QK_NORM,
    "tp2_zero0_qk_norm": ["parallel.tensor_parallel_size=2", "parallel.zero_stage=0"] + QK_NORM,
    # the head norms in DeepSpeed's pipeline layers
    "pp2_qk_norm": ["parallel.pipeline_parallel_size=2"] + QK_NORM,
    "dp2_bf16": ["parallel.zero_stage=1", "training.precision=bf16"],
    "pp2_bf16": ["parallel.pipeline_parallel_size=2", "training.precision=bf16"],
}
# A batch-size ramp (training.rampup_batch_size): 7 steps of 4 samples, then 3 of 8. An odd
# count of steps before the change puts DeepSpeed's own accumulation boundary (a micro-batch
# count kept over the run) off by one after it, unless the engine marks it (engine.set_batch).
RAMP = ["training.rampup_batch_size=[4, 4, 28]"]
LAYOUTS.update({
    "ramp": RAMP,
    "dp2_zero2_ramp": ["parallel.zero_stage=2"] + RAMP,
    "pp2_ramp": ["parallel.pipeline_parallel_size=2"] + RAMP,
    # the update held back until the divergence guard has seen the loss (training/sdc.py)
    "dp2_zero1_rerun_ramp": ["parallel.zero_stage=1", "resilience.rerun_suspect_steps=true",
                             "resilience.loss_spike_factor=3.0"] + RAMP,
    # DeepSpeed counts the context-parallel ranks of a sample in its batch
    "cp2_ramp": ["parallel.context_parallel_size=2", "parallel.zero_stage=1"] + RAMP,
    "pp2_interleaved_ramp": ["parallel.pipeline_parallel_size=2",
                             "parallel.pipeline_schedule=interleaved",
                             "parallel.virtual_pipeline_size=2"] + RAMP,
})
# Gemma 3's layer (gpt2 flavour only): GeGLU, per-head q and k norms, norms after the attention
# and the MLP, the embedding times 8, every 2nd layer global and the windowed ones with their own
# rotary base, the scores scaled by 0.2 (not 1/sqrt(16): Gemma 3 27B's query_pre_attn_scalar)
GEMMA = ["model.attention.softmax_scale=0.2", "model.activation=geglu",
         "model.normalization=rmsnorm",
         "model.position_embedding_type=rotary", "model.add_bias_linear=false",
         "model.attention.qk_norm=true", "model.residual.post_norms=true",
         "model.residual.embedding_multiplier=8.0", "model.attention.sliding_window=16",
         "model.attention.sliding_window_pattern=2", "model.attention.window_rotary_base=100.0"]
# Gemma 2's layer (gpt2 flavour only): Gemma 3's without q and k norms and the windowed layers'
# base, the scores and the logits capped low enough to bite (model.attention.logit_softcapping:
# the math core, sdpa having no cap; model.output.logit_softcapping: the tied head's logits)
GEMMA2 = [s for s in GEMMA if "qk_norm" not in s and "window_rotary_base" not in s] + [
    "model.attention.logit_softcapping=0.5", "model.output.logit_softcapping=1.0",
    "model.attention_backend=math"]
# Each Gemma layer alone (its one-rank reference) and under TP with SP, DeepSpeed's pipeline,
# Ulysses, and the ring, which rotates q and k (and caps the scores) in its own attention
# (model/context_attention.py)
GEMMA_LAYOUTS = {"tp2_sp": ["parallel.tensor_parallel_size=2", "parallel.sequence_parallel=true"],
                 "pp2": ["parallel.pipeline_parallel_size=2"],
                 "cp2": ["parallel.context_parallel_size=2", "parallel.zero_stage=1"],
                 "ring_cp2": ["parallel.context_parallel_size=2", "parallel.zero_stage=1",
                              "parallel.context_parallel_algo=ring"]}
GEMMA_RUNS = []  # every Gemma layout's name (GPT2_ONLY below)
for _name, _layer in (("gemma", GEMMA), ("gemma2", GEMMA2)):
    LAYOUTS[_name] = _layer
    LAYOUTS.update({f"{where}_{_name}": sets + _layer for where, sets in GEMMA_LAYOUTS.items()})
    GEMMA_RUNS += [_name] + [f"{where}_{_name}" for where in GEMMA_LAYOUTS]
# The ramp with the learning-rate schedule counted in samples (Megatron-LM's --lr-*-samples):
# a warm-up of 8 samples, 2 steps of the ramp's 4, and the cosine's end at sample 48.
SAMPLES = ["optimizer.lr_warmup_iters=0", "optimizer.lr_warmup_samples=8",
           "optimizer.lr_decay_samples=48"]
LAYOUTS["ramp_samples"] = RAMP + SAMPLES
# gpt2 only: what they test does not depend on the flavour
GPT2_ONLY = {"ramp", "ramp_reference", "dp2_zero2_ramp", "pp2_ramp", "cp2_ramp",
             "pp2_interleaved_ramp", "resume_dp2_zero1_ramp", "dp2_zero1_rerun_ramp",
             "ramp_samples", "resume_ramp_samples", *GEMMA_RUNS,
             # the layouts whose setting does not touch what the flavours differ in, each in
             # the flavour with more to get wrong: the labels counted and the documents' masks,
             # ZeRO-0's clipping, a resume, and uneven stages (GPT-2's embedding tied across
             # the stages); the plain layouts run both
             "tp2_masked", "pp2_masked", "pp2_interleaved_masked", "tp2_sp_docs",
             "tp2_docs_recompute_selective", "pp2_docs_recompute_selective", "tp2_zero0",
             "pp2_zero0", "resume_pp2", "resume_dp2_zero2", "pp2_first1", "pp2_last1",
             "pp2_first1_zbh1"}
# and in the Llama flavour alone: q/k norms with kv_channels and q/k/v biases (Qwen2, Qwen3)
LLAMA_ONLY = {"tp2_sp_qk_norm", "tp2_zero0_qk_norm", "pp2_qk_norm"}


def runs(layout: str, flavour: str) -> bool:
    """Whether `layout` is trained in `flavour` (GPT2_ONLY, LLAMA_ONLY)."""
    return not ((layout in GPT2_ONLY and flavour != "gpt2")
                or (layout in LLAMA_ONLY and flavour != "llama"))


# Exact resume: stop and checkpoint at step 5, then a new engine resumes to step 10.
# (the layout, the step the first run stops at, what the second run changes)
RESUME = {"resume_pp2": (LAYOUTS["pp2"], 5, []),
          "resume_dp2_zero2": (LAYOUTS["dp2_zero2"], 5, []),
          # stopped inside the ramp: the resumed run's batch follows the samples consumed
          "resume_dp2_zero1_ramp": (["parallel.zero_stage=1"] + RAMP, 5, []),
          # the ramp's reference without a ramp: 7 steps of 4 samples, resumed at 8 (the data
          # continues at the samples consumed, the LR schedule by steps)
          "ramp_reference": (["training.global_batch_size=4"], 7,
                             ["training.global_batch_size=8"]),
          # stopped inside the ramp and the warm-up's decay: the schedule's samples continue
          "resume_ramp_samples": (RAMP + SAMPLES, 5, [])}


def _resumed(run_dir, overrides, stop, then):
    first = train(load_config(TINY, overrides + [f"run.dir={run_dir}",
                                                 f"training.exit_interval={stop}",
                                                 "training.save=true"]))
    second = train(load_config(TINY, overrides + then + [f"run.dir={run_dir}",
                                                         "training.load=auto"]))
    assert first.steps == stop and second.steps == 10, (first.steps, second.steps)
    return first.losses + second.losses, first.timing.step_s + second.timing.step_s


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--layouts", required=True)
    p.add_argument("--flavours", default="gpt2,llama")
    p.add_argument("--workdir", required=True, help="shared by all ranks (run directories)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rank = int(os.environ.get("RANK", "0"))
    results = {}
    for layout in args.layouts.split(","):
        for flavour in args.flavours.split(","):
            if not runs(layout, flavour):
                continue
            run_dir = os.path.join(args.workdir, f"{layout}-{flavour}")
            t0 = time.perf_counter()
            if layout in RESUME:
                overrides, stop, then = RESUME[layout]
                losses, times = _resumed(run_dir, COMMON + FLAVOURS[flavour] + overrides, stop,
                                         then)
            else:
                cfg = load_config(TINY, COMMON + FLAVOURS[flavour] + LAYOUTS[layout]
                                  + [f"run.dir={run_dir}"])
                summary = train(cfg)
                losses, times = summary.losses, summary.timing.step_s
            # the logged gradient norms (rank 0 writes the metrics; a resumed run's both parts)
            lines = steps(read_metrics(RunDir(run_dir).metrics)) if rank == 0 else []
            results.setdefault(layout, {})[flavour] = {
                "losses": losses, "lrs": [r.lr for r in lines],
                "norms": [] if layout in RESUME else [r.grad_norm for r in lines],
                "batches": [r.global_batch_size for r in lines],
                "seconds": time.perf_counter() - t0,
                "step_time_s": sorted(times)[len(times) // 2]}
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    exit_after(main)
