"""How DeepSpeed reduces the gradients of experts split over ranks (parallel.expert_parallel_size
> 1; docs/moe.md). With EP = 1 every rank holds every expert and nothing here applies.

DeepSpeed's MoE support keys on three things, all set here and nowhere else:
- a parameter with `allreduce = False` and `group_name` (deepspeed.moe.utils.is_moe_param) is
  reduced over the expert-data-parallel group registered under that name in
  deepspeed.utils.groups (`ep_size_<EP>`, DeepSpeed's naming), not over data parallel; we
  register our own ep and edp groups (parallel/experts.py) there rather than let DeepSpeed fold
  the ranks its own way;
- ZeRO-1/2 partition such parameters over that group when their optimizer param group says
  `moe: True` and `name` (engine/optimizer.py splits them so);
- the engine sets `has_moe_layers` only for modules that are instances of DeepSpeed's own MoE
  class, so during deepspeed.initialize its `MoE` name answers for our MoELayer too.

The mean stays the global mean: DeepSpeed divides expert gradients by the whole data-parallel
size (engine._reduce_expert_gradients, and ZeRO's average_tensor) after summing over edp; each
rank's expert gradient already sums the contributions of its ep group's tokens (the all-to-all's
backward), so the result is (1/dp) x the sum over every rank's tokens, as without EP.

ZeRO-0's fp32 gradient clipping (deepspeed.runtime.utils.clip_grad_norm_) averages each rank's
norm over data parallel, which is wrong once ranks hold different experts:
engine/zero0_norm.clip_fp32 takes its place (each distinct gradient once). ZeRO-1/2 sum
their partitions' squares over data parallel, which counts each expert once. ZeRO-3 is refused
(config/validate.moe_error): DeepSpeed refuses experts it did not build under ZeRO-3."""
from __future__ import annotations

import contextlib

import torch.distributed as dist
from torch import nn

from megatron.model.moe import MoELayer


def group_name(ep: int) -> str:
    return f"ep_size_{ep}"


def is_expert(param: nn.Parameter) -> bool:
    """Marked by model/moe/experts.mark_experts."""
    return getattr(param, "expert_dim", None) is not None


def mark_for_deepspeed(module: nn.Module, expert) -> bool:
    """Marks the expert parameters and registers the groups; whether the experts take
    DeepSpeed's expert path (parallel/experts.ExpertParallel.split: EP > 1, or TP > 1, where
    each TP rank routes other tokens). Before deepspeed.initialize.

    `model_parallel = True`: DeepSpeed's ZeRO norm counts a parameter without it on TP rank 0
    only (a replicated weight); an expert's gradient on every rank is its own share."""
    if expert is None or not expert.split:
        return False
    name = group_name(expert.size)
    for param in module.parameters():
        if is_expert(param):
            param.allreduce, param.group_name = False, name
            param.model_parallel = True
    from deepspeed.utils import groups
    groups._EXPERT_PARALLEL_GROUP[name] = expert.ep_group
    groups._EXPERT_DATA_PARALLEL_GROUP[name] = expert.edp_group
    groups._EXPERT_PARALLEL_GROUP_RANKS[name] = dist.get_process_group_ranks(expert.ep_group)
    groups._EXPERT_DATA_PARALLEL_GROUP_RANKS[name] = dist.get_process_group_ranks(
        expert.edp_group)
    return True


def update_router_biases(layers, state, skipped: bool) -> None:
    """After each optimizer step, the auxiliary-loss-free router biases of this stage's MoE
    layers move toward balance (model/moe/router.update_bias), from the loads of every rank of
    the stage: summed over data x context parallel, then over tensor parallel."""
    from megatron.model.moe.router import update_bias
    update_bias([layer.router for layer in layers], (state.dp_cp_group, state.tp_group),
                skipped)


def moe_layers(module: nn.Module):
    return [m for m in module.modules() if isinstance(m, MoELayer)]


def set_aux_grad_scale(layers, scale: float) -> None:
    """The gradient the routers' auxiliary losses get in the backward (model/moe/layer.py):
    what the engine scales the loss by (1 / gradient-accumulation steps, times the fp16 loss
    scale), so they weigh as if added to each micro-batch's loss."""
    for layer in layers:
        layer.aux_grad_scale = scale


class _MoEOrOurs(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, (cls.deepspeed_moe, MoELayer))


@contextlib.contextmanager
def recognised_as_moe(split: bool):
    """While DeepSpeed's engine is built, its isinstance(module, MoE) also holds for our
    MoELayer (split experts only), so it sets has_moe_layers and reduces them as above."""
    if not split:
        yield
        return
    import deepspeed.runtime.engine as ds_engine
    real = ds_engine.MoE
    ds_engine.MoE = _MoEOrOurs("MoE", (), {"deepspeed_moe": real})
    try:
        yield
    finally:
        ds_engine.MoE = real
