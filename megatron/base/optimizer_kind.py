"""Which optimizer wrapper DeepSpeed ends up running for a precision, ZeRO stage and pipeline
size: what engine._configure_optimizer picks for the config this project generates (a torch
AdamW handed to deepspeed.initialize). Torch- and DeepSpeed-free: the planner's memory and time
models import it to know which states exist and how they are sharded."""
from __future__ import annotations

# "torch":  fp32 without ZeRO, the torch optimizer as is (no master copy)
# "fp16":   FP16_Optimizer: whole fp32 master and moments (fp16; bf16 without pipelining)
# "bf16":   BF16_Optimizer: master and moments sharded over DP (bf16 with pipelining, ZeRO-0;
#           bf16 at ZeRO-1 with fp32 gradient accumulation, training.grad_accum_dtype)
# "zero":   DeepSpeedZeroOptimizer / stage 3 (ZeRO 1-3, every precision)
OPTIMIZER_KINDS = ("torch", "fp16", "bf16", "zero")


def optimizer_kind(precision: str, zero: int, pp: int, grad_accum: str = "model") -> str:
    """The DeepSpeed optimizer wrapper (OPTIMIZER_KINDS) for this precision, ZeRO stage,
    pipeline size and gradient accumulation dtype (training.grad_accum_dtype)."""
    if zero == 1 and precision == "bf16" and grad_accum == "fp32":
        return "bf16"
    if zero > 0:
        return "zero"
    if precision == "fp32":
        return "torch"
    return "bf16" if precision == "bf16" and pp > 1 else "fp16"
