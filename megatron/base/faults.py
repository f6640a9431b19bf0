"""Test-only fault hooks read from the environment: faults the fault tests inject into a real run
(per-file storage latency; a corrupted optimizer state, gradient or weight), in one place so a
reader can see every way a test can bend a run. Each is a no-op unless its variable is set;
none is a setting for users.

One is a benchmark's, not a fault: MEGATRON_TEST_DEVICE_GFLOPS, an emulated accelerator's
time for each TP-layer GEMM (read by parallel/layers.py at import).

Hooks older than this module still live beside the code they bend: MEGATRON_TEST_STOP_AT
(training/watchdog.py), MEGATRON_TEST_CORRUPT (training/sdc.py), MEGATRON_TEST_FAIL_WRITER and
MEGATRON_TEST_SLOW_WRITER (checkpoint/sharded.py)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Optional

# Seconds added to every fsync of a checkpoint's file or folder, the start-up probe's included:
# a loaded parallel file system, where each file costs a round trip to the metadata server.
SLOW_FILES_VAR = "MEGATRON_TEST_SLOW_FILES"


def file_latency() -> None:
    """Waits MEGATRON_TEST_SLOW_FILES seconds, when set (called before each fsync)."""
    value = os.environ.get(SLOW_FILES_VAR)
    if value:
        time.sleep(float(value))


# RANK:STEP:TARGET:FACTOR: on that rank, in that step, the largest-magnitude element of the first
# tensor of TARGET holding a non-zero one is multiplied by FACTOR, as a flipped exponent bit
# would: exp_avg or exp_avg_sq (its AdamW state, after the update), param (its copy of the
# weights, after the update) or grad (its reduced gradients, before the update; ZeRO-0 without
# pipelining). Read by training/state_check.py.
STATE_FAULT_VAR = "MEGATRON_TEST_STATE_FAULT"
STATE_TARGETS = ("exp_avg", "exp_avg_sq", "param", "grad")


@dataclass(frozen=True)
class StateFault:
    step: int
    target: str
    factor: float


def state_fault(rank: int, environ=os.environ) -> Optional[StateFault]:
    """This rank's MEGATRON_TEST_STATE_FAULT, or None."""
    value = environ.get(STATE_FAULT_VAR)
    if not value:
        return None
    try:
        who, step, target, factor = value.split(":")
        fault = StateFault(int(step), target, float(factor))
        who = int(who)
    except ValueError:
        raise ValueError(f"{STATE_FAULT_VAR}={value!r}: expected RANK:STEP:TARGET:FACTOR, e.g. "
                         "1:3:exp_avg:1e20") from None
    if target not in STATE_TARGETS:
        raise ValueError(f"{STATE_FAULT_VAR}={value!r}: TARGET {target!r} is not one of "
                         f"{', '.join(STATE_TARGETS)}")
    return fault if who == rank else None


def scale_largest(tensors, factor: float) -> None:
    """Multiplies the largest-magnitude element of the first tensor with a non-zero one."""
    for t in tensors:
        flat = t.detach().view(-1)
        if flat.numel() and bool(flat.abs().max() > 0):
            i = int(flat.abs().argmax())
            flat[i] = flat[i] * factor
            return
    raise RuntimeError(f"{STATE_FAULT_VAR}: no tensor holds a non-zero element to corrupt")


# GFLOP/s of an emulated accelerator: every GEMM of the TP layers (parallel/layers.linear) also
# sleeps its multiply-adds' time at this rate, in the pass that computes it (forward, input
# gradient, weight gradient, so a deferred W pass carries its own share). A rank then waits as
# it would on a device, without holding a core: with more ranks than cores, the pipeline
# schedules' bubbles show (benchmarks/pipeline_schedules.py --device-gflops).
DEVICE_GFLOPS_VAR = "MEGATRON_TEST_DEVICE_GFLOPS"


def device_seconds_per_flop(environ=os.environ) -> Optional[float]:
    """1 / (MEGATRON_TEST_DEVICE_GFLOPS x 1e9), or None when unset."""
    value = environ.get(DEVICE_GFLOPS_VAR)
    if not value:
        return None
    try:
        rate = float(value)
    except ValueError:
        rate = 0.0
    if not rate > 0:
        raise ValueError(f"{DEVICE_GFLOPS_VAR}={value!r}: expected a positive rate in GFLOP/s, "
                         "e.g. 5")
    return 1.0 / (rate * 1e9)

