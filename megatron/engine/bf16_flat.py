"""The gradient norm and clipping of DeepSpeed's BF16_Optimizer (training.grad_accum_dtype=fp32)
over each parameter group's flat fp32 gradient buffer, where that is the same figure.

BF16_Optimizer.step takes the norm, and clips, one parameter tensor at a time: for a 1.3B GPT,
292 norms and 292 scalings a step, each a launch from the host after the backward, where the
device waits for them (benchmarks/results/gpu_h200.md: 89% busy against the plain loop's 98%).
Its gradients live in one flat fp32 buffer per group, zeroed every step, so its padding is zero
and a parameter without a gradient adds nothing: where every gradient on this rank counts once
in the norm (one tensor-parallel rank, so no replicated weight is left to rank 0; one pipeline
stage, so no tied copy is left out; no experts), the buffer's norm is the tensors' norm and
scaling it scales them all: one launch a group. Elsewhere the optimizer is left as it is."""
from __future__ import annotations

# Read by tests, which compare both ways of taking the norm.
ENABLED = True


def applies(optimizer, tp: int, pp: int) -> bool:
    return (ENABLED and type(optimizer).__name__ == "BF16_Optimizer" and tp == 1 and pp == 1
            and not getattr(optimizer, "has_moe_layers", False)
            and hasattr(optimizer, "fp32_groups_gradients_flat"))


def use_flat_buffers(optimizer, tp: int, pp: int) -> bool:
    """Points the optimizer's norm and clipping at its flat buffers where that is exact (the
    module's docstring); returns whether it did."""
    if not applies(optimizer, tp, pp):
        return False
    flats = list(optimizer.fp32_groups_gradients_flat)

    def grads_for_norm(for_clipping: bool = False):
        # BF16_Optimizer's contract: the list for clipping, (non-expert list, expert dict) else
        return flats if for_clipping else (flats, {})

    optimizer.get_grads_for_norm = grads_for_norm
    return True
