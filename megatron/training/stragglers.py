"""Slow ranks are named: every training.straggler_interval steps one small all-gather of each
rank's own forward time over those steps (engine.ComputeTimer: its compute, not the time it waits
for the others in collectives) names each rank slower than the median of the others by more than
training.straggler_factor (the first window, with the warm-up steps, is not judged): a warning
and {"event": "straggler", "step", "rank", "host", "ratio"}, the host being the rank's node in
start-up's roster. A throttled GPU or a bad node slows the whole job; this says which rank.

Under tensor parallelism a rank's forward includes its TP group's all-reduces, so a slow rank's
TP peers wait inside their forward too and are named with it: the group is named, not the rank.
Under pipeline parallelism DeepSpeed runs the forward passes and nothing is measured (off)."""
from __future__ import annotations

import logging
import statistics
from typing import List

import torch
import torch.distributed as dist

from megatron.checkpoint.records import StragglerEvent

log = logging.getLogger(__name__)


class Stragglers:
    def __init__(self, t, engine, pipeline: bool, device: torch.device, nodes: List[str],
                 writer):
        """t: the training section; nodes: every rank's node (startup's roster); writer: rank
        0's MetricsWriter (None elsewhere)."""
        self.interval = 0 if pipeline else t.straggler_interval
        self.factor, self.engine, self.device = t.straggler_factor, engine, device
        self.writer, self.hosts = writer, nodes
        self.warm = False

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
        """Each rank against the median of the others (of many ranks, the median; of two, the
        other one: a median that counts the slow rank itself would hide half its delay)."""
        found = []
        for rank, s in enumerate(seconds):
            others = statistics.median(seconds[:rank] + seconds[rank + 1:])
            if others > 0 and s > self.factor * others:
                found.append(StragglerEvent(step, rank, self.hosts[rank], round(s / others, 3)))
        for event in found:
            if self.writer:
                log.warning("rank %d on %s is a straggler: its forward passes took %.2fx the "
                            "median over the last %d steps", event.rank, event.host, event.ratio,
                            self.interval)
                self.writer.write(event)
        return found
