"""Slow ranks are named: every resilience.straggler_interval steps one small all-gather of each
rank's median micro-batch forward over those steps (engine.ComputeTimer: its compute, not the
time it waits for the others in collectives) compares it with the median of the other ranks. A
rank above resilience.straggler_factor in two windows in a row is named: a warning and
{"event": "straggler", "step", "rank", "host", "ratio"} (the host being the rank's node in
start-up's roster; the ratio, this window's), and again each window it stays slow. The first
window, with the warm-up steps, is not judged. A throttled GPU or a bad node slows the whole
job; this says which rank.

Two statistics keep noise from naming anyone: the median forward, so a one-off pause (a garbage
collection, the OS preempting the process) does not count, and two windows in a row, so a stretch
of contention on a shared node does not either; a slow GPU stays slow.

Under tensor parallelism a rank's forward includes its TP group's all-reduces, so a slow rank's
TP peers wait inside their forward too and are named with it: the group is named, not the rank.
Under pipeline parallelism DeepSpeed runs the forward passes and nothing is measured (off)."""
from __future__ import annotations

import logging
import statistics
from typing import List

import torch
import torch.distributed as dist

from megatron.base.records import StragglerEvent

log = logging.getLogger(__name__)


class Stragglers:
    def __init__(self, r, engine, pipeline: bool, device: torch.device, nodes: List[str],
                 writer):
        """r: the resilience section; nodes: every rank's node (startup's roster); writer: rank
        0's MetricsWriter (None elsewhere)."""
        self.interval = 0 if pipeline else r.straggler_interval
        self.factor, self.engine, self.device = r.straggler_factor, engine, device
        self.writer, self.hosts = writer, nodes
        self.warm = False
        self.slow_before: set = set()  # the ranks above the factor in the last window

    def after_step(self, step: int) -> List[StragglerEvent]:
        """Collective every `interval` steps (all ranks reach the same steps); the events."""
        if not self.interval or step % self.interval or dist.get_world_size() == 1:
            return []
        if not self.warm:  # the first window holds the warm-up steps: not judged
            self.warm = True
            self.engine.compute.take()
            return []
        mine = torch.tensor([self.engine.compute.take()], device=self.device)
        every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        return self._name(step, [float(x.item()) for x in every])

    def _name(self, step: int, seconds: List[float]) -> List[StragglerEvent]:
        """One window's median forwards (index: rank): the events of the ranks slow in this
        window and the one before. Each rank against the median of the others (of many ranks,
        the median; of two, the other one: a median that counts the slow rank itself would hide
        half its delay)."""
        slow = {}
        for rank, s in enumerate(seconds):
            others = statistics.median(seconds[:rank] + seconds[rank + 1:])
            if others > 0 and s > self.factor * others:
                slow[rank] = round(s / others, 3)
        found = [StragglerEvent(step, rank, self.hosts[rank], ratio)
                 for rank, ratio in slow.items() if rank in self.slow_before]
        self.slow_before = set(slow)
        for event in found:
            if self.writer:
                log.warning("rank %d on %s is a straggler: its median forward pass over the "
                            "last %d steps took %.2fx the other ranks' median", event.rank,
                            event.host, self.interval, event.ratio)
                self.writer.write(event)
        return found
