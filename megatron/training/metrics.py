"""Model FLOPs, MFU, memory, and the metrics.jsonl / TensorBoard writers."""
from __future__ import annotations

import json
import logging
import math
import numbers
import os
import resource
from typing import Any, Dict, List, Optional, Tuple

import torch
from megatron.config.model_math import model_flops_per_token  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)


def memory_gb(device: torch.device) -> float:
    """Peak allocated device memory on a GPU; peak resident set size of the process on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB -> GiB


class MetricsWriter:
    """Appends one JSON object per line; mirrors scalars to TensorBoard when available."""

    def __init__(self, run_dir: str, tensorboard: bool):
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.file = open(self.path, "a", buffering=1)
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self.tb = SummaryWriter(os.path.join(run_dir, "tensorboard"))
            except ImportError:
                log.warning("tensorboard is not installed; metrics go to metrics.jsonl only "
                            "(pip install tensorboard)")

    def write(self, record: Dict[str, Any]) -> None:
        """One line of strict JSON: non-finite numbers are written as null and named in
        "nonfinite". TensorBoard gets the true values, so a diverged loss shows there as NaN."""
        line, nonfinite = strict_json_record(record)
        self.file.write(json.dumps(line, allow_nan=False) + "\n")
        if self.tb is not None:
            prefix = record.get("split", "train")
            for key, value in record.items():
                if _is_number(value) and key != "step":
                    self.tb.add_scalar(f"{prefix}/{key}", float(value), record["step"])

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.close()


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def strict_json_record(record: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """The record with NaN and +-infinity replaced by None, and the keys replaced (dotted for
    nested dicts). Python's json writes NaN/Infinity, which strict readers (jq, JavaScript,
    most JSON libraries) reject; one bad step must not make the whole file unreadable."""
    nonfinite: List[str] = []

    def clean(value, key):
        if isinstance(value, dict):
            return {k: clean(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v, f"{key}[{i}]") for i, v in enumerate(value)]
        if not _is_number(value):
            return value
        if isinstance(value, numbers.Integral):
            return int(value)  # numpy scalars are not JSON-serializable
        if not math.isfinite(value):
            nonfinite.append(key)
            return None
        return float(value)

    line = clean(record, "")
    if nonfinite:
        line["nonfinite"] = nonfinite
    return line, nonfinite


def mfu(tflops_per_gpu: float, peak: Optional[float]) -> Optional[float]:
    return None if not peak else tflops_per_gpu / peak
