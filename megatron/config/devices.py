"""Per-device peaks, the one table the trainer's MFU, the planner's presets and the benchmarks
read. Vendor data sheets; an MI250X has two GCDs and each is one device, so its figures are half
the card's."""
from __future__ import annotations

from typing import Dict, Optional

# Dense bf16/fp16 matrix peak, TFLOP/s.
# MI325X: the MI300X's chip with 256 GB of HBM3E at 6 TB/s (AMD Instinct MI325X data sheet: the
# same bf16 and FP8 peaks).
PEAK_TFLOPS: Dict[str, float] = {"mi250x": 191.5, "mi250": 181.0, "mi300x": 1307.0,
                                 "mi325x": 1307.0, "a100": 312.0, "h100": 989.0, "h200": 989.0}
# Dense FP8 matrix peak, TFLOP/s (the data sheets' figures "with sparsity" halved): H100/H200
# SXM 1979 (NVIDIA H100 and H200 data sheets: 3958 sparse), MI300X 2614.9 (AMD Instinct MI300X
# data sheet: 5229.8 sparse). A100 and MI250X have no FP8 matrix units.
PEAK_FP8_TFLOPS: Dict[str, float] = {"mi300x": 2614.9, "mi325x": 2614.9, "h100": 1979.0,
                                     "h200": 1979.0}
# HBM bandwidth, GB/s (MI250X: 3.2768 TB/s per card, 1638 per GCD).
PEAK_HBM_GBPS: Dict[str, float] = {"mi250x": 1638.0, "mi250": 1638.0, "mi300x": 5300.0,
                                   "mi325x": 6000.0,
                                   "mi300a": 5300.0, "a100": 2039.0, "h100": 3350.0,
                                   "h200": 4800.0, "gh200": 4000.0, "b200": 8000.0}


def lookup(table: Dict[str, float], name: str) -> Optional[float]:
    """The entry whose key is in the device name (the longest match: mi250x before mi250)."""
    lowered = name.lower().replace(" ", "")
    for key in sorted(table, key=len, reverse=True):
        if key in lowered:
            return table[key]
    return None
