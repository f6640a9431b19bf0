"""DeepSpeed's 16-bit optimizers tell a step with a non-finite gradient from the gradient norm
they take anyway, instead of also in a pass of their own.

Under bf16 and fp16 the ZeRO 1-2 optimizer (DeepSpeedZeroOptimizer) and, without ZeRO, the
FP16 optimizers (FP16_UnfusedOptimizer for the torch AdamW this project hands DeepSpeed,
FP16_Optimizer for DeepSpeed's fused ones) look twice each step. First a pass over every
gradient tensor on the rank (an amax, an amin and four elementwise tests each: for a 1.3B GPT's
292 tensors some 2,000 launches from the host), then an all-reduce of the flag and `.item()`,
which holds the host until the device has run the whole backward, so the launches of the
update that follow start with the device idle (benchmarks/results/gpu_h200.md: ZeRO-1 kept the
device busy 321 ms of a 411 ms step). Then the norm they take for clipping and for the log: a
NaN or an infinity in any gradient makes it non-finite, summed over the data- and
model-parallel groups the flag is reduced over, and `step` skips the step on it
(`is_invalid_grad_norm`; the FP16 optimizers' `_skip_invalid_grad_norm` also backs the fp16
loss scale off). DeepSpeed's BF16_Optimizer has only the second; ZeRO-3 tests its one flat
gradient buffer (a few launches, fp16 only): both are left as they are.

Where that norm is taken (ZeRO: `compute_grad_norm`, DeepSpeed's default and this project's,
which the clip and the logged norm need; the FP16 optimizers: always), the first pass finds nothing
the second misses, so it is turned off: the same steps are skipped and counted (the health
guard's `resilience.max_skipped_steps`), the fp16 loss scale moves as before, and a step
without a non-finite gradient runs as before, bit for bit. The one difference: bf16 gradients
so large that their squares overflow fp32 (|g| > 1.8e19) are now skipped too (fp16 ones cannot
be). Left as they are: CPU offload (its flag is gathered while the gradients are copied out);
experts (an expert's norm is summed over its expert-data-parallel group only, where the flag
reaches every data-parallel rank, so a NaN in one expert would skip the step on some ranks and
not others); and the FP16 optimizers beyond one tensor-parallel rank and one stage (their norm
read gradients without their parameters, so a tensor-parallel rank past the first counted none
of its own; engine/zero0_norm.mark_gradients now marks them, tested at TP 2 in fp16 by
tests/integration/test_engine_fp16_tp_norm.py, but whether the norm alone may then decide the
skip there was not measured, so the pass is kept)."""
from __future__ import annotations

from typing import Optional

# Read by tests, which compare both ways.
ENABLED = True


FP16 = ("FP16_Optimizer", "FP16_UnfusedOptimizer")


def _zero_applies(optimizer) -> bool:
    return (getattr(optimizer, "compute_grad_norm", False)
            and getattr(optimizer, "check_grad_overflow", False)
            and not getattr(optimizer, "cpu_offload", True)
            and not getattr(optimizer, "has_moe_layers", True))


def _fp16_applies(optimizer, tp: int, pp: int) -> bool:
    checker = getattr(optimizer, "overflow_checker", None)
    return (tp == 1 and pp == 1 and hasattr(checker, "check")
            and not getattr(checker, "has_moe_params", True))


def use_norm_check(optimizer, tp: int, pp: int) -> Optional[str]:
    """Leaves the overflow verdict to the norm (the module's docstring) where that is the same
    verdict; returns the optimizer's class name where it did, None where it left it."""
    kind = type(optimizer).__name__
    if not ENABLED:
        return None
    if kind == "DeepSpeedZeroOptimizer" and _zero_applies(optimizer):
        def check_overflow(partition_gradients: bool = True) -> None:
            optimizer.overflow = False  # step() reads the norm next; a non-finite one sets it
        optimizer.check_overflow = check_overflow
        return kind
    if kind in FP16 and _fp16_applies(optimizer, tp, pp):
        # step() takes the gradients' norm next; a non-finite one skips the step
        checker = optimizer.overflow_checker
        checker.check = lambda param_groups=None: False
        checker.has_overflow = lambda params, has_moe_params=None: False
        return kind
    return None
