"""Per-device peaks, the one table the trainer's MFU, the planner's presets and the benchmarks
read. Vendor data sheets; an MI250X has two GCDs and each is one device, so its figures are half
the card's."""
from __future__ import annotations

from typing import Dict, Optional

# Dense bf16/fp16 matrix peak, TFLOP/s.
PEAK_TFLOPS: Dict[str, float] = {"mi250x": 191.5, "mi250": 181.0, "mi300x": 1307.0,
                                 "a100": 312.0, "h100": 989.0, "h200": 989.0}
# HBM bandwidth, GB/s (MI250X: 3.2768 TB/s per card, 1638 per GCD).
PEAK_HBM_GBPS: Dict[str, float] = {"mi250x": 1638.0, "mi250": 1638.0, "mi300x": 5300.0,
                                   "mi300a": 5300.0, "a100": 2039.0, "h100": 3350.0,
                                   "h200": 4800.0, "gh200": 4000.0, "b200": 8000.0}


def lookup(table: Dict[str, float], name: str) -> Optional[float]:
    """The entry whose key is in the device name (the longest match: mi250x before mi250)."""
    lowered = name.lower().replace(" ", "")
    for key in sorted(table, key=len, reverse=True):
        if key in lowered:
            return table[key]
    return None
