"""The gradient norm of DeepSpeed's ZeRO 1-2 optimizer in one multi-tensor pass per group.

DeepSpeedZeroOptimizer.get_grad_norm_direct takes the L2 norm one gradient tensor at a time:
each is copied to DeepSpeed's norm dtype (fp64 wherever the device has it), reduced, and moved,
so for a 1.3B GPT's 292 tensors some 900 launches a step come from the host after the
backward, and every gradient is written again as fp64 (8 bytes an element) and read back.
`torch._foreach_norm` in the norm dtype takes the same per-tensor norms in one multi-tensor
kernel on a GPU (a loop on the CPU) without the copies. The rest is DeepSpeed's, unchanged: the
same tensors counted (no padding; no pipeline-replicated copy; on a tensor-parallel rank past
the first only its tensor-parallel weights), their squares summed, the sum all-reduced over the
data- and model-parallel groups, its square root, a non-finite norm masked to -1 (which
engine/overflow_check.py reads as the step's overflow). On the CPU the norms are DeepSpeed's to
the bit (tests/integration/test_engine_zero_norm.py); on a GPU the kernel sums in another order,
in fp64. Other norm types, and CPU offload (its own norm), are left to DeepSpeed."""
from __future__ import annotations

# Read by tests, which compare both ways.
ENABLED = True


def use_foreach_norm(optimizer) -> bool:
    """Points the ZeRO 1-2 optimizer's L2 gradient norm at `torch._foreach_norm` (the module's
    docstring); returns whether it did."""
    if not (ENABLED and type(optimizer).__name__ == "DeepSpeedZeroOptimizer"
            and hasattr(optimizer, "get_grad_norm_direct")):
        return False
    import torch
    from deepspeed import comm as dist
    from deepspeed.runtime.utils import (is_model_parallel_parameter,
                                         mask_nan_or_inf_with_val_inplace)
    from deepspeed.runtime.zero.utils import get_norm_dtype

    own = optimizer.get_grad_norm_direct

    def counted(gradients, params):
        grads = (g for g in gradients if not getattr(g, "_zero_padding", False))
        return [g.detach() for g, p in zip(grads, params)
                if not getattr(p, "ds_pipe_replicated", False)
                and (is_model_parallel_parameter(p) or optimizer.model_parallel_rank == 0)]

    def get_grad_norm_direct(gradients, params, norm_type=2):
        if float(norm_type) != 2.0:
            return own(gradients, params, norm_type)
        grads = counted(gradients, params)
        if grads:
            norms = torch._foreach_norm(grads, 2.0, dtype=get_norm_dtype())
            total = torch.stack(norms).pow(2.0).sum().float()
        else:
            total = torch.tensor(0.0, dtype=torch.float32).to(optimizer.device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=optimizer.dp_process_group)
        optimizer._model_parallel_all_reduce(tensor=total, op=dist.ReduceOp.SUM)
        total = total.pow(0.5)
        mask_nan_or_inf_with_val_inplace(total, device=optimizer.device)
        return total

    optimizer.get_grad_norm_direct = get_grad_norm_direct
    return True
