"""ZeRO-0's gradient norm: counted over every tensor-parallel rank's shards in 16 bits, and
logged in fp32.

**16 bits.** Without ZeRO, a bf16 or fp16 model's update runs in DeepSpeed's
FP16_UnfusedOptimizer (the optimizer this project hands DeepSpeed is torch's AdamW). Its step
takes the norm for clipping, the logged norm and the skip of a non-finite step over the gradient
*tensors* (deepspeed.runtime.utils.get_weight_norm), and decides per tensor whether this TP rank
counts it by the `tensor_model_parallel` / `model_parallel` markers.
engine/model.mark_tensor_parallel puts those on the parameters; a gradient carries none, so a TP
rank past the first counted nothing, and the norm summed over the model-parallel group was TP
rank 0's alone: at TP 2 the tiny GPT's first step gave 0.752 where one rank gives 0.873, and
clipping acted on that. Before each step the gradient of every parameter split over TP now gets
the parameter's marker, so each TP rank counts its own shards and rank 0 alone the replicated
tensors, as DeepSpeed's ZeRO norms do from the parameters. Nothing else changes; at TP 1 there
is nothing to mark. Experts split over ranks are a second case the same norm gets wrong (it
leaves their gradients out); config/validate.experts_error refuses ZeRO-0 in 16 bits with them.

**fp32.** DeepSpeed clips an fp32 model's gradients without ZeRO in clip_fp32_gradients
(deepspeed.runtime.utils.clip_grad_norm_), which sums squares over its mpu's model-parallel
group and averages the result over data parallel. Under DeepSpeed's pipeline engine that group
is the tensor-parallel slice of one stage, so each stage clipped by its own stage's norm (the
tiny GPT at PP 2 logged 0.863 where one rank gives 0.873, and with every step clipped its loss
drifted 5e-5 from one rank's in four steps); with experts split over ranks the average over
data parallel is wrong too; and the norm was dropped, so the metrics said "grad norm n/a".
clip_fp32 takes its place: each rank adds the squared norms of its gradients, each divided by
how many ranks hold the same gradient (a dense one alike on its data x context parallel ranks,
a replicated one on TP rank 0 only, an expert's alike on its expert-data-parallel ranks, a
weight tied across stages on its first stage only: ds_pipe_replicated), one all-reduce over the
world sums them, and the clip coefficient scales every gradient. The norm is kept where
DeepSpeed reads an optimizer's norm after the step."""
from __future__ import annotations

import types
from typing import List, Optional

import torch
import torch.distributed as dist


def _sharded(optimizer) -> List[torch.Tensor]:
    return [p for group in getattr(optimizer, "fp16_groups", ()) for p in group
            if getattr(p, "tensor_model_parallel", False) or getattr(p, "model_parallel", False)]


def mark_gradients(optimizer, tp: int) -> bool:
    """Wraps the ZeRO-0 16-bit optimizer's step so that its gradient norm counts every TP
    rank's shards (the module's docstring); returns whether it did."""
    if tp == 1 or type(optimizer).__name__ != "FP16_UnfusedOptimizer":
        return False
    sharded = _sharded(optimizer)
    if not sharded:
        return False
    own = optimizer.step

    def step(*args, **kwargs):
        for p in sharded:
            if p.grad is not None:
                p.grad.tensor_model_parallel = True
        return own(*args, **kwargs)

    optimizer.step = step
    return True


def clip_fp32(engine, state, edp_size: Optional[int]) -> bool:
    """Replaces DeepSpeed `engine`'s ZeRO-0 fp32 clipping by the norm over every distinct
    gradient (the module's docstring); returns whether it did. state: the ParallelState;
    edp_size: the expert-data-parallel size of experts split over ranks (None where they are
    not split: every rank holds every expert, as a dense weight)."""
    if engine.zero_optimization() or engine.fp16_enabled() or engine.bfloat16_enabled():
        return False
    from megatron.engine.experts import is_expert
    dp_cp, tp_rank = state.dp_cp, state.tp_rank

    def share(p) -> float:
        if edp_size is not None and is_expert(p):
            return 1.0 / edp_size
        if getattr(p, "ds_pipe_replicated", False):
            return 0.0
        if getattr(p, "partition_dim", None) is None and tp_rank != 0:
            return 0.0
        return 1.0 / dp_cp

    def clip(self):
        params = [p for p in self.module.parameters() if p.grad is not None]
        by_share: dict = {}
        for p in params:
            by_share.setdefault(share(p), []).append(p.grad)
        total = torch.zeros((), dtype=torch.float32, device=self.device)
        for weight, grads in by_share.items():
            if weight:
                squares = torch.stack(torch._foreach_norm(grads)).float().pow(2).sum()
                total = total + squares * weight
        dist.all_reduce(total)
        norm = total.sqrt()
        coef = torch.clamp(self.gradient_clipping() / (norm + 1e-6), max=1.0)
        if params:
            torch._foreach_mul_([p.grad for p in params], coef)
        # DeepSpeed reports the optimizer's _global_grad_norm after the step (our AdamW has
        # none of its own under ZeRO-0), so the run's metrics carry this norm.
        self.optimizer._global_grad_norm = norm
        return norm
    engine.clip_fp32_gradients = types.MethodType(clip, engine)
    return True
