"""FP8 matrix multiplies (Job.fp8), priced only: this trainer has no FP8.

What is priced is Transformer Engine's recipe as Megatron Core and NeMo run it on H100 and
MI300X (Micikevicius et al. 2022, "FP8 Formats for Deep Learning", arXiv 2209.05433; NVIDIA
Transformer Engine's documentation, "Using FP8 with Transformer Engine"): the four linear
layers of every transformer layer (QKV, out-projection, fc1, fc2, and an MoE layer's experts)
run their forward, input-gradient and weight-gradient GEMMs in FP8 with a per-tensor scale
(E4M3 forward, E5M2 gradients under the hybrid format); the attention core, the output layer
(logits), the router, norms and element-wise kernels stay in the model precision, and so do
the activations between the layers.

Time (timing.py):
- the linear layers' GEMMs at the device's FP8 peak (ClusterSpec.fp8_tflops) through the same
  efficiency curve as the 16-bit GEMMs;
- the casts, memory-bound: each linear layer's input X is cast with its transpose (the FP8
  GEMM takes both operands "TN": X for the forward, X^T for dW = dY^T X) and each output
  gradient dY likewise: 2 bytes read, 2 written, per element (cast_bytes); once per forward
  (again under full recompute) and once per backward; a MoE layer's experts' k T rows in
  place of the dense MLP's (experts.io_delta).
The weights' casts are once a step (the first micro-batch's; the cached copy serves the rest)
and are left out: 4 bytes a parameter, under 1% of any case's step here.

Memory (memory.py):
- weights: the FP8 copy of each linear weight and its transpose, cached across micro-batches:
  2 bytes a transformer parameter the rank holds whole (one layer's under ZeRO-3/FSDP, whose
  gathered weights are cast each time). With fp8_params the weight itself is FP8 (1 byte, no
  16-bit copy) and only its transpose is added: 1 + 1 bytes in place of 2 (under ZeRO-3 the
  sharded weight's own saving is not counted);
- activations: the inputs the linear layers keep for their weight gradients are kept as their
  FP8 copy (1 byte): the two norm outputs (QKV's and fc1's inputs) and fc2's input; the
  out-projection's input is the attention output, which FlashAttention's backward keeps in the
  model precision anyway, so with flash its FP8 copy is added, without flash it replaces it
  (stored_delta).
Communication: with fp8_params the data-parallel parameter all-gather of the transformer
weights moves 1 byte a parameter (gather_bytes); gradients are reduced as without FP8.

Sources of the validation (docs/planner.md, "FP8"): NVIDIA's DGX Cloud recipes publish each
BF16 run's FP8 twin, the same layout (published.yaml, fp8_twins)."""
from __future__ import annotations

from typing import Optional

from megatron.config import ModelConfig
from megatron.config.errors import InputError
from megatron.planner import activations as act
from megatron.planner.hardware import ClusterSpec, FP8_PRESET_NAMES
from megatron.planner.layout import Job, Layout

# bytes a cast moves per element: the 16-bit tensor read, its FP8 copy and FP8 transpose written
CAST_BYTES_PER_ELEMENT = 4
# bytes a cached FP8 weight adds per parameter: the copy and its transpose; with fp8_params the
# transpose alone (the parameter itself is the FP8 copy, 1 byte instead of 2)
CACHE_BYTES, CACHE_BYTES_FP8_PARAMS = 2, 1
PARAM_SAVING_FP8_PARAMS = 1


def fp8_problem(job: Job, spec: Optional[ClusterSpec] = None) -> Optional[str]:
    """Why the job's FP8 setting cannot be priced (one line naming the flag), or None."""
    if job.fp8_params and not job.fp8:
        return "--fp8-params keeps FP8 weights for FP8 matrix multiplies: add --fp8"
    if not job.fp8:
        return None
    if job.precision not in ("bf16", "fp16"):
        return (f"--fp8 with precision {job.precision}: FP8 matrix multiplies run inside a "
                "bf16 or fp16 model; use --precision bf16")
    return cluster_problem(spec) if spec is not None else None


def cluster_problem(spec: ClusterSpec) -> Optional[str]:
    """Why FP8 matrix multiplies cannot be priced on this cluster, or None."""
    if spec.fp8_tflops is None:
        return (f"--fp8 on cluster {spec.name}: its devices have no FP8 matrix units (FP8: "
                f"{FP8_PRESET_NAMES}); drop --fp8, or give the cluster YAML fp8_tflops")
    return None


def linear_tflops(job: Job, spec: ClusterSpec, fp8_gemm_eff: float = 1.0) -> float:
    """The matrix rate the linear layers' GEMMs are priced against: under Job.fp8 FP8's peak
    times fp8_gemm_eff (profile.Constants: the share of the 16-bit GEMMs' efficiency FP8 ones
    reach), else the model precision's peak."""
    if job.fp8:
        problem = fp8_problem(job, spec)
        if problem:
            raise InputError(problem)
        return float(spec.fp8_tflops) * fp8_gemm_eff
    return spec.matmul_tflops(job.precision)


def cast_bytes(m: ModelConfig, lay: Layout) -> tuple:
    """(forward, backward) bytes one layer's casts move per micro-batch on one rank: its linear
    layers' inputs X, then their output gradients dY (activations.linear_io_elements)."""
    x, dy = act.linear_io_elements(m, lay)
    return CAST_BYTES_PER_ELEMENT * x, CAST_BYTES_PER_ELEMENT * dy


def stored_delta(m: ModelConfig, lay: Layout, precision: str) -> float:
    """Bytes one layer's kept activations change by under FP8 (per micro-batch, one rank;
    negative: saved), where the layer keeps its activations (not under full recompute): QKV's
    and fc1's inputs (the norm outputs) and fc2's input kept as 1-byte copies; the
    out-projection's input as well without flash, beside the attention output with it."""
    e, sb, t = act.act_bytes(precision), act.local_tokens(m, lay), lay.tp
    rep = 1.0 / t if lay.sequence_parallel else 1.0
    context = sb * m.num_attention_heads * m.head_dim / t
    saved = (e - 1) * (2 * sb * m.hidden_size * rep + sb * m.ffn_hidden_size / t)
    return -saved + (context if lay.flash else -(e - 1) * context)


def weight_bytes(job: Job, transformer_params: int, largest_layer: int, zero: int) -> float:
    """Bytes the FP8 weights add to a rank's weights (negative: saved) for the transformer
    parameters it holds whole (largest_layer alone under ZeRO-3, whose gathered weights are
    cast as they arrive)."""
    if not job.fp8:
        return 0.0
    n = largest_layer if zero == 3 else transformer_params
    if job.fp8_params:
        # the parameter is the FP8 copy: 16-bit weights become 1-byte ones, plus the transpose
        whole = transformer_params if zero != 3 else 0
        return CACHE_BYTES_FP8_PARAMS * n - PARAM_SAVING_FP8_PARAMS * whole
    return CACHE_BYTES * n


def gather_bytes(job: Job, transformer_params: float, other_params: float,
                 element_bytes: float) -> float:
    """Bytes of the data-parallel parameter all-gather's buffer: the transformer weights at 1
    byte under fp8_params, the rest (embeddings, norms outside the layers) as before."""
    if job.fp8_params:
        return transformer_params + element_bytes * other_params
    return element_bytes * (transformer_params + other_params)
