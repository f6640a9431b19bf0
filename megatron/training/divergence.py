"""The divergence guard's policy in the loop: on the action every rank agreed on, stop the run
without saving (the diverged state is never committed) or roll it back to the newest complete
checkpoint, past the batches that caused a spike; log spikes. health.py judges each step; this
module acts on the judgement."""
from __future__ import annotations

import logging
from typing import Optional

from megatron.base.records import DivergedEvent, RollbackEvent, SpikeEvent
from megatron.config.errors import Diverged
from megatron.training.checkpointer import Checkpointer
from megatron.training.health import ROLLBACK, STOP, DivergenceGuard, Verdict

log = logging.getLogger(__name__)


class Divergence:
    def __init__(self, r, fp16: bool, checkpointer: Checkpointer, writer):
        """r: the resilience section; fp16: training.precision is fp16 (skips are then loss-scale
        overflows); writer: rank 0's MetricsWriter (None elsewhere)."""
        self.guard = DivergenceGuard(r, fp16)
        self.max_rollbacks, self.rollbacks = r.max_rollbacks, 0
        self.checkpointer, self.writer = checkpointer, writer

    def observe(self, step: int, loss: float, skipped: bool) -> Verdict:
        return self.guard.observe(step, loss, skipped)

    def act(self, step: int, verdict: Verdict, action: int) -> Optional[int]:
        """Acts on the agreed action: raises Diverged to stop; returns the step rolled back to,
        or None when training goes on from `step`."""
        reason = verdict.reason or f"step {step}: another rank found the run diverged"
        if action == STOP:
            self._stop(step, reason)
        if action == ROLLBACK:
            return self._roll_back(step, reason)
        if verdict.spike:
            log.warning("loss spike: %s", verdict.reason)
            self._event(SpikeEvent(step, verdict.reason))
        return None

    def silent_data_error(self, suspect, run) -> None:
        """A step whose update was withheld or must not be kept: a suspect result that differed
        when computed again (training/sdc.py) or a training state that broke an invariant
        (state_check.py). The suspects are named in metrics.jsonl and their nodes in bad_nodes
        (by rank 0), and the run stops with the checker's error (exit 5)."""
        for event in suspect.events():
            if self.writer:  # rank 0; every rank raises the error below, which names them too
                log.error("step %d: rank %d on %s: %s", event.step, event.rank, event.host,
                          event.describe())
            self._event(event)
        if self.writer:
            for node, reason in suspect.bad_nodes():
                run.add_bad_node(node, reason)
        raise suspect.error(run.bad_nodes)

    def _roll_back(self, step: int, reason: str) -> int:
        """Reloads the newest checkpoint; the data stream goes on from where it is, so the
        batches since that checkpoint (the spike's among them) are skipped."""
        if self.rollbacks >= self.max_rollbacks:
            self._stop(step, f"{reason}, after {self.rollbacks} rollbacks "
                             "(resilience.max_rollbacks)")
        found = self.checkpointer.last_good()
        if found is None:
            self._stop(step, f"{reason}, and there is no checkpoint to roll back to")
        back = self.checkpointer.load(found.folder, None).step
        log.warning("%s: rolled back to %s; the batches of steps %d-%d are skipped", reason,
                    found.folder, back + 1, step)
        self._event(RollbackEvent(step, back, reason))
        self.rollbacks += 1
        self.guard.rolled_back()
        return back

    def _stop(self, step: int, reason: str) -> None:
        found = self.checkpointer.last_good()
        where = (f"the last good checkpoint is {found.folder} (step {found.step}); continue "
                 "from it with checkpoint.load=auto, e.g. with a lower optimizer.lr" if found else
                 "no checkpoint was saved before it")
        self._event(DivergedEvent(step, reason))
        raise Diverged(f"training stopped: {reason}; nothing was saved after it, {where}")

    def _event(self, record) -> None:
        if self.writer:
            self.writer.write(record)
