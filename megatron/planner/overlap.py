"""What each training engine hides behind compute, by communication kind (docs/planner.md,
"Overlap by framework"). Defaults are the engines' documented behaviour, not fitted.

- deepspeed (this trainer, DeepSpeed 0.19): the backward's collective of each column-parallel
  layer runs asynchronously under that layer's weight-gradient GEMM, as Megatron-LM's
  (parallel/layers._ColumnLinear); the other TP collectives are synchronous; the gradient
  reduction hides what `overlap_comm` and the bucket size allow (zero_settings.overlap_claim;
  nothing under the pipeline engine, which reduces after the last micro-batch); ZeRO's weight
  all-gather and the pipeline engine's sends block.
- megatron-deepspeed (the Megatron-DeepSpeed forks the published DeepSpeed-engine runs used:
  MT-NLG, BLOOM, GPT-NeoX, Frontier's, LUMI's): as deepspeed, but every TP collective
  synchronous (their layers predate or lack the asynchronous all-reduce).
- megatron-lm (Megatron-LM without Transformer Engine's overlaps, as it has run since
  September 2021 and in Korthikanti et al. 2022): the gradient all-reduce runs after the
  backward and the sends block, but the backward's collective of each column-parallel layer
  (QKV, fc1: the all-reduce of the input gradient, under SP its reduce-scatter) runs
  asynchronously under that layer's weight-gradient GEMM (Megatron-LM commit 3f65246, 2 Sep
  2021: on unless --no-async-tensor-model-parallel-allreduce).
- megatron-lm-2021 (Megatron-LM as in Narayanan et al. 2021, before that commit): nothing
  hidden.
- megatron-core (Megatron-LM/Megatron Core with --tp-comm-overlap, --overlap-grad-reduce,
  --overlap-param-gather and the distributed optimizer): NVIDIA's "Communication Overlap" pages
  (NeMo / Megatron Bridge user guides): the DP reduce-scatter and the parameter all-gather are
  chunked per transformer layer (per layer group of a virtual stage with PP) and overlap
  compute, exposing one chunk; the TP collectives overlap the GEMMs they feed (Transformer
  Engine's userbuffers), which needs TP >= 2 and sequence parallelism; pipeline sends overlap
  compute (overlap_p2p_comm) only with the interleaved schedule, else they are batched and
  exposed. Its context-parallel attention is Transformer Engine's, flash-based for every
  algorithm (flash_cp: memory.py keeps no block pair's scores). Its experts, as Megatron-LM's,
  are split over the TP ranks (expert_tp: experts.py).
- fsdp (PyTorch FSDP, FULL_SHARD or SHARD_GRAD_OP, forward and backward prefetch,
  limit_all_gathers: as llm-foundry runs its MPT benchmarks, and composed with tensor and
  pipeline parallelism as Meta's Llama 3 stack ran it): the gradient reduce-scatter runs per
  wrapped block under the backward and the weight all-gathers are prefetched, like
  megatron-core's chunks; SHARD_GRAD_OP keeps the gradients sharded, so with gradient
  accumulation it reduce-scatters every micro-batch (the planner's ZeRO-2). Its TP collectives
  are synchronous (no userbuffers); its pipeline sends are asynchronous (torch's batched
  isend/irecv; Llama 3: "we adopt asynchronous point-to-point communication in PP"), priced
  hidden under the interleaved schedule as megatron-core's; its context-parallel attention is
  flash-based (PyTorch's context_parallel runs SDPA's flash kernels per block; Llama 3's
  all-gather CP runs flash on the gathered keys and values). Its memory differs from
  DeepSpeed's ZeRO-3 (memory.fsdp_state_bytes).
- aa-scaling (Aleph Alpha's Scaling, the engine of Hagemann et al. 2023's layout sweeps;
  github.com/Aleph-Alpha/scaling, src/scaling/core): Megatron-style TP layers whose collectives
  are plain synchronous autograd functions; a pipeline schedule of DeepSpeed's instruction
  design whose sends are blocking torch.distributed send/recv of whole tensors; its ZeRO
  (stage 1) all-reduces every gradient after the backward, cast to fp32 for the wire
  (optimizer/allreduce.py), then steps each rank's shard: nothing hidden, twice a
  reduce-scatter's bytes, in fp32. Model states as DeepSpeed's ZeRO-1 (bf16 weights and
  gradients on the parameters, fp32 master and moments sharded). DeepSpeed's pipeline-engine
  cost of each slot is not charged: its cause is not established (docs/planner.md, "The
  pipeline engine's cost per layer") and nothing says this engine pays it. Two traits of its
  layers, priced in memory and time: under sequence parallelism the norm all-gathers its
  output (nn/norm/rms_norm.py) and the column-parallel layers after it keep that whole input
  for their weight gradient, with no shard kept and no regather in the backward
  (sp_whole_inputs); and its output layer all-gathers every TP rank's logits
  (transformer/model/layers/lm_head.py, through ColumnParallelLinear's all_concat) for an fp32
  cross-entropy over the whole vocabulary on every rank (whole_vocab_logits). A third, of its
  SwiGLU MLP (nn/mlp.py): the gate and up projections are two column-parallel layers, two
  GEMMs where Megatron runs one of both widths, and without SP each copies its input into the
  TP region on its own, so the backward all-reduces that input's gradient twice: three
  backward TP all-reduces a layer where Megatron has two (gate_up_split). And its pipeline
  keeps the outputs it has spent (nn/parallel_module/parallel_module.py, buffers.py): each
  stage's output stays in its buffer slot (read with Buffers.get, never taken; the input is
  taken once its gradient is sent) until a later micro-batch reuses the slot, and a stage r
  has max(2, min(p - r + 1, m)) slots for at most min(p - r, m) micro-batches in flight, so
  one spent micro-batch's output stays beside them; on the last stage that is its gathered
  whole-vocabulary logits (keeps_spent_outputs).
- nanotron (Hugging Face's nanotron as the Ultra-Scale Playbook's layout sweep ran it:
  github.com/huggingface/nanotron at e24d2483, Feb 2025, its benchmark configuration on branch
  nouamane/bench2, 67c5ebb6): TP in its REDUCE_SCATTER mode (sequence parallelism) with
  tp_linear_async_communication, whose column-parallel backward reduce-scatters the input
  gradient under the weight-gradient GEMM (tp_wgrad; the forward all-gather overlaps only the
  local shard's GEMM: exposed); gradients accumulated in one full fp32 buffer
  (accumulate_grad_in_fp32) and all-reduced in fp32 (fp32_allreduce): at ZeRO-0 by torch DDP's
  bucket hooks under the last micro-batch's backward, at ZeRO-1 in one blocking all-reduce of
  the whole buffer after the pipeline, then each rank steps its shard and the bf16 weights are
  all-gathered, blocking (grad_reduce "ddp"); each micro-batch's bf16 gradients added into
  the fp32 buffer in a pass of their own after its backward (grad_add_pass: 10 bytes a
  parameter, engine.py / gradient_accumulator.py); model states as Megatron's (bf16 weights, the
  fp32 gradient buffer whole, fp32 master and moments sharded at ZeRO-1) plus the bf16
  gradients a backward leaves before they are added to the buffer (memory.py); 1F1B whose
  sends wait at once (pipe_send False), a sent output kept by nothing (frees_outputs); the
  loss vocabulary-parallel over TP. Its stages are split by a compute cost of its own
  (cost_split: layout.cost_split_layers), which gives the output layer's stage fewer layers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from megatron.planner.problem import Problem


class Refusal(Problem):
    """Why an engine cannot run a layout (layout.engine_run_problem, memory.engine_problem): the
    one-line message, keyed by what it refuses without the reasons ('--zero 2', '--schedule
    zbh1', '--cp-algo ring', '--cp > 1', ...), the key search counts what it leaves out by."""


@dataclass(frozen=True)
class Overlap:
    tp_comm: bool        # TP collectives under the layer's GEMMs (with SP only)
    grad_reduce: str     # "overlap_comm": DeepSpeed's claim; "layer": all but one layer's chunk;
    #                      "ddp": as "layer" at ZeRO-0, exposed at ZeRO-1; "none": exposed
    param_gather: bool   # the distributed optimizer's weight all-gather under the next forward
    pipe_send: bool      # pipeline sends under compute (interleaved schedule only)
    tp_wgrad: bool = False  # the backward's column-parallel TP collectives under their
    #                         weight-gradient GEMMs (Megatron-LM's async all-reduce)
    flash_cp: bool = False  # context-parallel attention in flash kernels (Transformer Engine's,
    #                         PyTorch's): no block pair's scores kept (activations.ring_explicit)
    frees_outputs: bool = False  # a stage's sent output freed until its backward (Megatron's
    #                              deallocate_pipeline_outputs; memory._stage_activations)
    expert_tp: bool = False  # each expert split over the TP ranks (Megatron's expert tensor
    #                          parallelism, its default): the rows a rank receives gathered over
    #                          TP; False: whole experts, each TP rank routing its own share of
    #                          the tokens (this trainer, model/moe/layer.py; experts.py)
    fp32_allreduce: bool = False  # ZeRO-1 all-reduces the whole gradient in fp32 (not a
    #                               reduce-scatter in the model dtype) before the shard's step
    sp_whole_inputs: bool = False  # under SP, QKV and fc1 keep their all-gathered input whole
    #                                for the weight gradient (activations.layer_full_bytes)
    whole_vocab_logits: bool = False  # the output layer gathers every TP rank's logits and the
    #                                   loss runs on the whole vocabulary on each rank
    gate_up_split: bool = False  # SwiGLU's gate and up projections two column-parallel layers:
    #                              two GEMMs; without SP one more backward TP all-reduce a layer
    reduce_fixed: bool = False  # the engine's code reduces gradients after the backward and has
    #                             no overlap to switch on: the printed range does not vary it
    #                             (ranges.overlap_variants)
    grad_add_pass: bool = False  # each micro-batch's model-dtype gradients added into an fp32
    #                              buffer in a pass of their own (10 bytes a parameter)
    cost_split: bool = False  # the engine splits the layers over stages by a compute cost
    #                           (layout.cost_split_layers: nanotron's), not evenly
    keeps_spent_outputs: bool = False  # the pipeline's buffer slots keep a micro-batch's stage
    #                                    output until the slot is reused: one spent
    #                                    micro-batch's, on the last stage its logits
    #                                    (memory._spent_slot_bytes)
    # What the engine can run beside its pipeline schedules (each schedule's record names the
    # engines that run it: config/schedules): its context-parallel algorithms (None: all; ():
    # no CP), and the line layout.engine_run_problem says where a layout asks for more
    cp_algos: Optional[Tuple[str, ...]] = None
    recomputes: Optional[Tuple[str, ...]] = None  # its recompute policies (None: all three)
    experts: bool = True  # it runs mixture-of-experts layers
    runs: str = ""


OVERLAP: Dict[str, Overlap] = {
    "deepspeed": Overlap(tp_comm=False, grad_reduce="overlap_comm", param_gather=False,
                         pipe_send=False, tp_wgrad=True),
    "megatron-deepspeed": Overlap(tp_comm=False, grad_reduce="overlap_comm", param_gather=False,
                                  pipe_send=False, cp_algos=("ulysses",),
                                  runs="DeepSpeed's pipeline engine runs 1F1B without model "
                                       "chunks, Megatron-DeepSpeed adds ZB-H1 "
                                       "(--enable-zbh1-pipeline) and DeepSpeed-Ulysses context "
                                       "parallelism"),
    "megatron-lm": Overlap(tp_comm=False, grad_reduce="none", param_gather=False,
                           pipe_send=False, tp_wgrad=True, frees_outputs=True, expert_tp=True),
    "megatron-lm-2021": Overlap(tp_comm=False, grad_reduce="none", param_gather=False,
                                pipe_send=False, expert_tp=True, cp_algos=(),
                                recomputes=("none", "full"), experts=False,
                                runs="Megatron-LM of 2021 runs 1F1B and its interleaved "
                                     "schedule, with no context parallelism, recomputes every "
                                     "layer or none (selective recompute is Korthikanti et "
                                     "al.'s, 2022) and has no mixture of experts (Megatron "
                                     "Core's came later)"),
    "megatron-core": Overlap(tp_comm=True, grad_reduce="layer", param_gather=True,
                             pipe_send=True, tp_wgrad=True, flash_cp=True, frees_outputs=True,
                             expert_tp=True),
    # param_gather is the distributed optimizer's (ZeRO-1); FSDP's ZeRO-2/3 gathers are priced
    # as every engine's
    "fsdp": Overlap(tp_comm=False, grad_reduce="layer", param_gather=False, pipe_send=True,
                    flash_cp=True, frees_outputs=True, cp_algos=("ring", "allgather"),
                    runs="torch.distributed.pipelining runs 1F1B, interleaved 1F1B and ZB-V, "
                         "its zero-bubble schedules interleaved or V-shaped; "
                         "torch.distributed.tensor.experimental.context_parallel is ring "
                         "attention, the keys and values passed round or all-gathered"),
    "aa-scaling": Overlap(tp_comm=False, grad_reduce="none", param_gather=False,
                          pipe_send=False, fp32_allreduce=True, sp_whole_inputs=True,
                          whole_vocab_logits=True, gate_up_split=True,
                          keeps_spent_outputs=True, reduce_fixed=True, cp_algos=(),
                          recomputes=("none", "full"), experts=False,
                          runs="Aleph Alpha's Scaling runs a DeepSpeed-style 1F1B without "
                               "model chunks (nn/pipeline_schedule/train.py), has no context "
                               "parallelism or mixture of experts, and checkpoints every layer "
                               "or none (ActivationCheckpointingType)"),
    "nanotron": Overlap(tp_comm=False, grad_reduce="ddp", param_gather=False, pipe_send=False,
                        tp_wgrad=True, frees_outputs=True, fp32_allreduce=True,
                        grad_add_pass=True, cost_split=True, reduce_fixed=True, cp_algos=(),
                        recomputes=("none", "full"), experts=False,
                        runs="nanotron (as of Feb 2025) runs 1F1B or all-forward-all-backward "
                             "without model chunks, with no context parallelism, recomputes "
                             "every layer or none, and its experts are not priced here"),
}
FRAMEWORKS = tuple(OVERLAP)
# the engines with Megatron-LM's optimizer
MEGATRON = ("megatron-lm", "megatron-lm-2021", "megatron-core")
# the engines on DeepSpeed's ZeRO optimizer and pipeline engine
DEEPSPEED = ("deepspeed", "megatron-deepspeed")


def exposed_share(comm_s: float, cover_s: float) -> float:
    """Share of `comm_s` seconds of communication left exposed when it runs under `cover_s`
    seconds of compute: what the compute cannot cover."""
    if comm_s <= 0:
        return 1.0
    return max(0.0, comm_s - cover_s) / comm_s
