"""The step-time model's features and their weights theta (timing.py's vocabulary, shared with
the pricing modules that add terms to it: moe_timing.py, cp_timing.py)."""
from __future__ import annotations

import math
from typing import Tuple

import numpy as np

from megatron.planner.profile import Constants, shape_curve

# comm/latency: collectives and sends inside a node; comm_inter/latency_inter: across nodes
# pipe_engine: seconds of the micro-batch slots run by DeepSpeed's pipeline engine (PP > 1),
# which theta scales by the share that engine adds (Constants.pipe_engine_share)
# pipe_layer: layers times micro-batch slots run by that engine (PP > 1), which theta prices at
# seconds each (Constants.pipe_layer_s)
FEATURES = ("gemm", "attn", "mem", "comm", "latency", "microbatch", "step", "comm_inter",
            "latency_inter", "pipe_engine", "pipe_layer")
GEMM, ATTN, MEM, COMM, LAT, MB, STEP, COMM_X, LAT_X, PIPE, PLAYER = range(len(FEATURES))


def dot(a, b) -> float:
    """a . b rounded once (math.fsum over the exact products). numpy's `@` calls BLAS, whose
    summation order follows the CPU's SIMD kernel (OpenBLAS picks Haswell, SkylakeX, Zen...), so
    the same prediction differed in its last bit between machines; this is the same on all."""
    return math.fsum((np.asarray(a, dtype=float) * np.asarray(b, dtype=float)).tolist())


def theta(c: Constants) -> np.ndarray:
    return np.array([1 / c.gemm_eff, 1 / c.flash_attn_eff, 1 / c.hbm_eff, 1 / c.comm_eff,
                     c.latency_scale, c.microbatch_overhead_s, c.step_overhead_s,
                     1 / c.inter_comm_eff, c.inter_latency_scale, c.pipe_engine_share,
                     c.pipe_layer_s])


def gemm_seconds(dims: Tuple[float, float, float], peak: float, half: float) -> float:
    """One GEMM at peak, slowed by the share of the device small dimensions leave idle
    (profile.shape_curve); gemm_eff, applied through theta, scales it to the device's best."""
    mm, nn, kk = dims
    return 2 * mm * nn * kk / (peak * shape_curve(dims, half))
