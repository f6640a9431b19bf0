"""One training step under torch.profiler, as a table of where the device's time went: the
kernels by total device time, the GPU's busy time against the step's wall time (what is left is
the device waiting on the host), and the same step's CPU operators by self time.

Two ways in:
- the trainer, as a plugin (megatron/config/plugins.py), which wraps the loop's step:
      MEGATRON_PROFILE_OUT=prof.txt PYTHONPATH=benchmarks/e2e \\
          python -m megatron.cli.train --plugin profile_step ...    # profiles step 6
  (MEGATRON_PROFILE_STEP picks another step);
- the plain PyTorch peer (peer_gpt.py), which calls profiled() when PEER_PROFILE_OUT is set.
"""
from __future__ import annotations

import os
import time

import torch

STEP = int(os.environ.get("MEGATRON_PROFILE_STEP", "6"))


# Device-side records that are not the device working: CUPTI's notes of a full launch queue
# (the host waiting on the device) and of its own buffers.
_NOT_WORK = ("Command Buffer Full", "Activity Buffer Request")


def busy_of(intervals):
    """The length of the union of (start, end) intervals, and how many there were."""
    total, end, count = 0.0, None, 0
    for start, stop in sorted(intervals):
        count += 1
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total, count


def device_busy_us(events):
    """Microseconds the device ran something in the profiled span: the union of its kernels',
    copies' and sets' intervals (a sum of the operators' self device times counts a kernel under
    its operator and again as itself, and counts CUPTI's queue notes as work)."""
    return busy_of((e.time_range.start, e.time_range.end) for e in events
                   if str(getattr(e, "device_type", "")).endswith("CUDA")
                   and e.name not in _NOT_WORK)


def profiled(fn, out_path: str, title: str):
    """Runs fn() once under the profiler, writes the tables to out_path, returns fn's result."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    with profile(activities=acts, record_shapes=True) as prof:
        t0 = time.perf_counter()
        result = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    key = "self_device_time_total" if hasattr(events[0], "self_device_time_total") \
        else "self_cuda_time_total"
    busy_us, count = device_busy_us(prof.events())
    sort = "device_time_total" if key == "self_device_time_total" else "cuda_time_total"
    with open(out_path, "w") as fh:
        fh.write(f"# {title}\n\nwall {wall * 1e3:.1f} ms; device busy (union of {count} kernel, "
                 f"copy and set intervals) {busy_us / 1e3:.1f} ms "
                 f"({100 * busy_us / 1e3 / (wall * 1e3):.0f}%)\n\n")
        fh.write("## by self device time\n\n")
        fh.write(events.table(sort_by=key, row_limit=45,
                              max_name_column_width=70) + "\n")
        fh.write("## by device time including children\n\n")
        fh.write(events.table(sort_by=sort, row_limit=30, max_name_column_width=70) + "\n")
        fh.write("## by self CPU time\n\n")
        fh.write(events.table(sort_by="self_cpu_time_total", row_limit=30,
                              max_name_column_width=70) + "\n")
        fh.write("## by input shapes (self device time)\n\n")
        fh.write(prof.key_averages(group_by_input_shape=True).table(
            sort_by=key, row_limit=40, max_name_column_width=60) + "\n")
    return result


def _install() -> None:
    out = os.environ.get("MEGATRON_PROFILE_OUT")
    if not out:
        return
    from megatron.training import loop

    original = loop._Loop._train_step

    def train_step(self):
        if self.step + 1 != STEP:
            return original(self)
        return profiled(lambda: original(self), out, f"megatron-train, step {STEP}")

    loop._Loop._train_step = train_step


_install()
