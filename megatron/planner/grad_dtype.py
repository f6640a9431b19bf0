"""The gradient dtype an engine keeps and reduces in (Job.grad_dtype), when the user fixes it.

None keeps each engine's default, which is what every published case and pinned result was
priced with: DeepSpeed holds ZeRO gradients in the parameter dtype and reduces them in its
communication_data_type (default: the model dtype); Megatron-LM accumulates a bf16 model's
gradients in an fp32 buffer (accumulate_allreduce_grads_in_fp32); FSDP reduces into an fp32
shard. Timing prices every engine's reduction in the model dtype by default (timing.grad_wire_bytes
says why).

"bf16" is Megatron-LM's --grad-reduce-in-bf16 (NeMo's default for bf16 recipes): the main-grad
buffer and its reduction are bf16. Megatron's optimizer then reads the grads as it does an fp16
model's (DistributedOptimizer copies the shard to fp32 at the step), so the states are its fp16
row of distrib_optimizer.md: 20 bytes a parameter without the distributed optimizer, 4 + 16/d
with it. "fp32": an fp32 buffer and reduction. For DeepSpeed the setting is its
communication_data_type (the wire only: ZeRO keeps .grad in the parameter dtype); for FSDP its
reduce_dtype (the wire only: the sharded gradient is fp32 either way)."""
from __future__ import annotations

from typing import Optional

GRAD_DTYPES = ("bf16", "fp32")
_BYTES = {"bf16": 2, "fp32": 4}


def grad_dtype_problem(grad_dtype: Optional[str], precision: str) -> Optional[str]:
    """Why this gradient dtype cannot go with the model's precision (one line), or None."""
    if grad_dtype is None:
        return None
    if grad_dtype not in GRAD_DTYPES:
        return f"--grad-dtype {grad_dtype}: expected one of {GRAD_DTYPES}"
    if grad_dtype == "bf16" and precision != "bf16":
        return (f"--grad-dtype bf16 with precision {precision}: bf16 gradients go with a bf16 "
                "model only; drop --grad-dtype or use --precision bf16")
    return None


def wire_bytes(grad_dtype: Optional[str], default: float) -> float:
    """Bytes per gradient element the data-parallel reduction sends."""
    return float(_BYTES[grad_dtype]) if grad_dtype else default


def megatron_precision(precision: str, grad_dtype: Optional[str]) -> str:
    """The row of Megatron's states table a job takes: bf16 gradients in a bf16 model are held
    and read as an fp16 model's are (16-bit buffer, fp32 copy for the step); an fp16 model's
    fp32 gradients (--accumulate-allreduce-grads-in-fp32) as a bf16 model's default."""
    if precision == "bf16" and grad_dtype == "bf16":
        return "fp16"
    if precision == "fp16" and grad_dtype == "fp32":
        return "bf16"
    return precision
