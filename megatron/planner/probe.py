"""The machine at hand as a ClusterSpec, for calibration trials on it (one node of N ranks).

Peak FLOPs and memory bandwidth are measured (a few GEMMs and copies, under a second), since a
CPU has no datasheet number the planner could trust; link bandwidths are nominal and the
calibration's comm_eff absorbs the difference."""
from __future__ import annotations

import os
import time

from megatron.planner.hardware import ClusterSpec


def _best_seconds(fn, repeats: int = 3) -> float:
    fn()  # warm-up: first call pays allocation and thread start-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def probe_local(nproc: int, gemm_dim: int = 1024) -> ClusterSpec:
    import torch

    cores = os.cpu_count() or 1
    threads = max(1, cores // nproc)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)  # each rank of a trial gets this share of the cores
    try:
        a = torch.randn(gemm_dim, gemm_dim)
        b = torch.randn(gemm_dim, gemm_dim)
        gemm = _best_seconds(lambda: torch.mm(a, b))
        big = torch.empty(32 * 2 ** 20 // 4)
        copy = _best_seconds(lambda: big.clone())
    finally:
        torch.set_num_threads(previous)
    tflops = 2 * gemm_dim ** 3 / gemm / 1e12
    hbm = 2 * big.numel() * 4 / copy / 1e9
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30 / nproc
    return ClusterSpec(name=f"local-{nproc}", gpu_memory_gb=round(mem_gb, 2),
                       peak_tflops=round(tflops, 4), fp32_tflops=round(tflops, 4),
                       gpus_per_node=nproc, intra_node_gbps=5.0, inter_node_gbps=5.0,
                       hbm_gbps=round(hbm, 2))
