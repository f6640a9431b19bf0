"""The DeepSpeed ZeRO communication settings of a layout, as the trainer will run it.

The values come from the function that writes deepspeed.json
(megatron.base.deepspeed_json.deepspeed_settings): the device's defaults, then the config's
`deepspeed:` section carried by the Job. The memory model reads the bucket size, its double
buffer under overlap_comm and the ZeRO-3 reuse distance from here; the time model reads
overlap_comm, the bucket size and communication_data_type (overlap_claim, comm_bytes)."""
from __future__ import annotations

import dataclasses
from typing import Optional

from megatron.base.deepspeed_json import DeepSpeedSettings, deepspeed_settings
from megatron.planner.activations import act_bytes
from megatron.planner.layout import Job, Layout
from megatron.planner.profile import Constants


def device_of(c: Constants) -> str:
    """A profile that measures resident memory (bucket_touched=1: megatron-plan calibrate on
    this machine's CPU) describes a CPU run; presets and cluster files describe GPUs."""
    return "cpu" if c.bucket_touched else "gpu"


def settings_for(job: Job, lay: Layout, device: str = "gpu") -> DeepSpeedSettings:
    return deepspeed_settings(lay.zero, lay.pp, lay.tp, job.model.hidden_size, device,
                              job.deepspeed, zero_group_size=lay.zero_dp)


def profile_settings(job: Job, lay: Layout, c: Constants,
                     device: Optional[str] = None) -> DeepSpeedSettings:
    """settings_for on the profile's device (device_of), with Constants.bucket_elems, when
    set, as reduce_bucket_size: what the memory and time models read."""
    s = settings_for(job, lay, device or device_of(c))
    if c.bucket_elems is not None:
        s = dataclasses.replace(s, reduce_bucket_size=int(c.bucket_elems))
    return s


def bucket_buffers(s: DeepSpeedSettings, zero: int) -> int:
    """Contiguous reduction buffers of reduce_bucket_size that ZeRO allocates: ZeRO-1/2 double
    them under overlap_comm (one fills while the other is reduced); none without
    contiguous_gradients; ZeRO-3 always one."""
    if zero == 0 or not s.contiguous_gradients:
        return 0
    return 2 if s.overlap_comm and zero in (1, 2) else 1


def comm_bytes(s: DeepSpeedSettings, model_bytes: float) -> float:
    """Bytes per gradient element on the wire: communication_data_type when set, else the
    model's own (DeepSpeed's default)."""
    return act_bytes(s.communication_data_type) if s.communication_data_type else model_bytes


def overlap_claim(s: DeepSpeedSettings, zero: int, params: int) -> float:
    """Share of each gradient reduction that overlap_comm lets hide behind the backward: every
    bucket but the last is reduced while the layers below it still compute, about
    1 - reduce_bucket_size / parameters. 0 without overlap_comm or at ZeRO-0. The time model
    bounds it by the backward it overlaps (timing.hidden_share)."""
    if zero == 0 or not s.overlap_comm or params <= 0:
        return 0.0
    return max(0.0, 1.0 - s.reduce_bucket_size / params)
