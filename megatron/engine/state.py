"""Where DeepSpeed keeps each parameter's fp32 master copy and Adam moments, as the
layout-free pieces megatron/checkpoint reads and writes (checkpoint/state.py).

    torch AdamW alone (ZeRO-0, fp32)   the parameter is the master; moments keyed by parameter
    FP16_Optimizer (ZeRO-0, fp16)      one unpartitioned fp32 flat buffer per group
    FP16_UnfusedOptimizer (ZeRO-0)     one fp32 copy per parameter (bf16 on the CPU)
    BF16_Optimizer, ZeRO-1/2           flat fp32 partitions per data-parallel rank; each
                                       parameter's slice is its `_hp_mapping`
    ZeRO-3                             each parameter's flattened shard split over data-parallel
                                       ranks; `grad_position` locates it in the flat fp32 group

Like the rest of megatron/engine, this module knows DeepSpeed's internals; nothing outside the
package does."""
from __future__ import annotations

import functools
from typing import Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from megatron.checkpoint.state import (MOMENTS, ExpertSplit, Fragment, LocalParam, Partition,
                                      RankState)
from megatron.parallel.state import RankCoord

_SCALER_FIELDS = ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis")


def global_named_parameters(model: nn.Module, prefixes: List[str]
                            ) -> Iterator[Tuple[str, nn.Parameter]]:
    """This rank's parameters under their GPTModel (TP=1, PP=1) names. `prefixes`: the GPTModel
    name prefix of each pipeline layer (model.PipeLayer.name), indexed as DeepSpeed numbers them
    (this stage's forward_funcs start at _local_start)."""
    if hasattr(model, "gpt_named_parameters"):  # interleaved chunks (engine/chunks.py)
        yield from model.gpt_named_parameters()
        return
    if not hasattr(model, "forward_funcs"):  # PP=1: the GPTModel itself
        yield from model.named_parameters()
        return
    tied = {id(m) for m in model.tied_modules.values()}
    seen = set()
    for idx, func in enumerate(model.forward_funcs):
        module = func.args[0] if isinstance(func, functools.partial) else func
        if not isinstance(module, nn.Module):
            continue
        # A tied embedding is the same module on the first and the last stage.
        prefix = "embedding." if id(module) in tied else prefixes[idx + model._local_start]
        for name, param in module.named_parameters():
            if id(param) not in seen:
                seen.add(id(param))
                yield prefix + name, param


def _base(opt) -> torch.optim.Optimizer:
    return getattr(opt, "optimizer", opt)


def _state(base: torch.optim.Optimizer, key: torch.Tensor) -> Dict[str, torch.Tensor]:
    """AdamW's state of `key`, created (zeros, step 0) when no step has run yet, so a resume can
    fill it before the first step; torch's AdamW then uses it as it finds it."""
    st = base.state[key]
    if not st:
        # Flags are the same in every group (ZeRO-3 fills a group's params only while stepping).
        group = base.param_groups[0]
        on_device = group.get("fused") or group.get("capturable")
        st["step"] = torch.zeros((), dtype=torch.float32,
                                 device=key.device if on_device else "cpu")
        for k in MOMENTS:
            st[k] = torch.zeros_like(key, memory_format=torch.preserve_format)
    return st


def _views(base, key: torch.Tensor, start: int, numel: int) -> Tuple[torch.Tensor, Dict]:
    """1-D views of elements [start, start+numel) of the fp32 tensor `key` that AdamW steps,
    and of its moments."""
    st = _state(base, key)
    return (key.detach().view(-1).narrow(0, start, numel),
            {k: st[k].view(-1).narrow(0, start, numel) for k in MOMENTS})


def _zero3(opt, p: nn.Parameter) -> Tuple[Optional[Fragment], Optional[torch.Tensor]]:
    group, offset, _ = opt.grad_position[opt.get_param_id(p)]
    size = p.partition_numel()
    start = dist.get_rank(group=p.ds_process_group) * size
    numel = max(0, min(size, p.ds_numel - start))
    # Small parameters DeepSpeed keeps gathered ("persistent") also hold the whole tensor.
    full = p.data if p.data.numel() == p.ds_numel else None
    if numel == 0:
        return None, full
    master, moments = _views(opt.optimizer, opt.fp32_partitioned_groups_flat[group], offset, numel)
    return Fragment(start, numel, master, moments, p.ds_tensor.data.view(-1).narrow(0, 0, numel)), full


def _fp32_copies(opt) -> Optional[Dict[int, Tuple[torch.Tensor, int]]]:
    """ZeRO-0 with 16-bit weights: id(param) -> (the fp32 tensor AdamW steps, offset in it).
    FP16_Optimizer keeps one flat buffer per group; FP16_UnfusedOptimizer (also DeepSpeed's
    bf16 ZeRO-0 optimizer on the CPU) one fp32 tensor per parameter."""
    out = {}
    if hasattr(opt, "fp32_groups_flat"):
        for flat, group in zip(opt.fp32_groups_flat, opt.fp16_groups):
            offset = 0
            for p in group:
                out[id(p)] = (flat, offset)
                offset += p.numel()
        return out
    if hasattr(opt, "fp32_groups") and hasattr(opt, "fp16_groups"):
        for copies, group in zip(opt.fp32_groups, opt.fp16_groups):
            out.update({id(p): (c, 0) for p, c in zip(group, copies)})
        return out
    return None


def rank_state(engine, named: List[Tuple[str, nn.Parameter]], coords: RankCoord, rng: dict
               ) -> RankState:
    """The pieces of state this rank owns, for every parameter it holds."""
    opt = engine.optimizer
    base = _base(opt)
    zero3 = hasattr(opt, "fp32_partitioned_groups_flat")
    partitions = getattr(opt, "single_partition_of_fp32_groups", None) or \
        getattr(opt, "fp32_groups_flat_partition", None)
    fp16 = None if zero3 or partitions is not None else _fp32_copies(opt)
    params, writes = [], True
    for name, p in named:
        shape = tuple(p.ds_shape) if zero3 else tuple(p.shape)
        lp = LocalParam(name, shape, Partition.of(p), experts=ExpertSplit.of(p, shape))
        if lp.experts is not None and not zero3 and partitions is None:
            # Replicated state: the first rank of each edp group writes its experts
            # (parallel/experts.py), as rank dp=0 writes the dense ones.
            lp.writes = lp.experts.writer
        if zero3:
            frag, lp.full = _zero3(opt, p)
            lp.fragments = [frag] if frag else []
        elif partitions is not None:  # flat partitions over data-parallel ranks
            lp.full = p.data
            m = getattr(p, "_hp_mapping", None)
            if m is not None:
                master, moments = _views(base, partitions[m.param_group_index],
                                         m.hp_fragment_address.start, m.hp_fragment_address.numel)
                lp.fragments = [Fragment(m.lp_fragment_address.start,
                                         m.lp_fragment_address.numel, master, moments)]
        elif fp16 is not None:
            writes = coords.dp_cp == 0
            flat, offset = fp16[id(p)]
            lp.full = p.data
            master, moments = _views(base, flat, offset, p.numel())
            lp.fragments = [Fragment(0, p.numel(), master, moments)]
        else:  # torch AdamW on the parameters themselves, replicated over data parallelism
            writes = coords.dp_cp == 0
            lp.fragments = [Fragment(0, p.numel(), *_views(base, p, 0, p.numel()))]
        params.append(lp)
    return RankState(params, writes, coords, rng, adam_step(engine))


def buffer_states(module: nn.Module, coords: RankCoord, prefixes: List[str]
                  ) -> List[LocalParam]:
    """The buffers modules name in `checkpointed_buffers` (the router's expert bias,
    model/moe/router.py): replicated fp32 state the optimizer does not step, stored as a
    parameter's master with zero moments, written by the rank at data x context and tensor
    parallel index 0 of each stage. Names are GPTModel's (prefixes as for
    global_named_parameters)."""
    out = []
    for prefix, sub in global_named_modules(module, prefixes):
        for attr in getattr(sub, "checkpointed_buffers", ()):
            b = getattr(sub, attr, None)
            if b is None:
                continue
            flat = b.data.view(-1)
            out.append(LocalParam(prefix + attr, tuple(b.shape), Partition(),
                                  writes=coords.dp_cp == 0 and coords.tp == 0,
                                  fragments=[Fragment(0, flat.numel(), flat, {
                                      k: torch.zeros_like(flat) for k in MOMENTS})]))
    return out


def global_named_modules(model: nn.Module, prefixes: List[str]
                         ) -> Iterator[Tuple[str, nn.Module]]:
    """This rank's submodules under their GPTModel names, each ending in '.' (or '' for the
    model itself), as global_named_parameters names parameters."""
    if hasattr(model, "gpt_named_modules"):  # model chunks (engine/chunks.py)
        yield from model.gpt_named_modules()
        return
    if not hasattr(model, "forward_funcs"):  # PP=1: the GPTModel itself
        for name, sub in model.named_modules():
            yield (name + "." if name else ""), sub
        return
    for idx, func in enumerate(model.forward_funcs):
        layer = func.args[0] if isinstance(func, functools.partial) else func
        if isinstance(layer, nn.Module):
            base = prefixes[idx + model._local_start]
            for name, sub in layer.named_modules():
                yield base + (name + "." if name else ""), sub


def adam_step(engine) -> int:
    steps = [int(st["step"]) for st in _base(engine.optimizer).state.values() if "step" in st]
    return max(steps, default=0)


def set_adam_step(engine, step: int) -> None:
    for st in _base(engine.optimizer).state.values():
        if "step" in st:
            st["step"].fill_(step)


def counters(engine) -> Dict[str, object]:
    """DeepSpeed's own step counters and the fp16 loss scaler, for the checkpoint's meta."""
    out = {k: int(getattr(engine, k, 0)) for k in ("global_steps", "global_samples",
                                                    "skipped_steps")}
    scaler = getattr(engine.optimizer, "loss_scaler", None)
    if scaler is not None:
        out["loss_scaler"] = {k: float(getattr(scaler, k)) for k in _SCALER_FIELDS
                              if isinstance(getattr(scaler, k, None), (int, float, torch.Tensor))}
    return out


def set_counters(engine, saved: Dict[str, object]) -> None:
    for k in ("global_steps", "global_samples", "skipped_steps"):
        if k in saved:
            setattr(engine, k, int(saved[k]))
    scaler = getattr(engine.optimizer, "loss_scaler", None)
    for k, v in (saved.get("loss_scaler") or {}).items():
        if scaler is not None and hasattr(scaler, k):
            current = getattr(scaler, k)
            setattr(scaler, k, type(current)(v) if isinstance(current, (int, float)) else v)
