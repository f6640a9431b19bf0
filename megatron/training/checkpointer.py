"""The checkpointer owns when a run saves and what a save or a load does: the step interval
(training.save_interval), the wall clock (save_interval_minutes), the deadline (the job's end,
exit_duration_minutes), the stop requests (signals, exit_interval) and the final save; the save
itself, the resume chosen at start-up, and loading an older checkpoint for a rollback. The loop
asks it after each step; nothing else decides about saves."""
from __future__ import annotations

import logging
import os
import time
from typing import Optional, Tuple

from megatron.checkpoint import sharded
from megatron.checkpoint.layout import data_record, rng_state, set_rng_state
from megatron.checkpoint.records import (CheckpointMeta, SaveEvent, StopEvent, events,
                                         read_metrics_tail)
from megatron.checkpoint.store import Found
from megatron.config import Config
from megatron.parallel.agree import rank0_decides
from megatron.parallel.random import reseed
from megatron.training.agree import Decisions
from megatron.training.clock import Deadline, SaveClock
from megatron.training.startup import Job

log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(self, cfg: Config, job: Job, writer, started: float):
        """writer: rank 0's MetricsWriter (None elsewhere); started: Unix time the run began
        (the deadline counts start-up too)."""
        self.t, self.seed, self.job, self.writer = cfg.training, cfg.training.seed, job, writer
        self.data = data_record(cfg)
        self.clock = SaveClock(self.t.save_interval_minutes)
        self.deadline = Deadline(self.t.exit_duration_minutes, started)
        if self.deadline.at is not None and job.launch.rank == 0:
            self.deadline.expect_save(*self._expected_save())

    def due(self, step_seconds: float) -> Tuple[bool, bool]:
        """(a save is due by the clock, the deadline is reached), as this rank sees them after a
        step of `step_seconds` (the deadline keeps room for one more step and a save)."""
        self.deadline.step_took(step_seconds)
        return self.clock.due(), self.deadline.reached()

    def after_step(self, step: int, consumed: int, agreed: Decisions) -> bool:
        """Saves when a save is due or the run stops here; True when it stops."""
        t = self.t
        out_of_time = agreed.out_of_time and step < t.train_iters
        if out_of_time:
            log.warning("stopping after step %d with a checkpoint: %s", step,
                        self.deadline.reason())
            self._event(StopEvent(step, "deadline"))
        if agreed.signalled:
            log.warning("stopping after step %d with a checkpoint: a stop signal", step)
            self._event(StopEvent(step, "signal"))
        stopping = agreed.signalled or out_of_time or bool(
            t.exit_interval and step % t.exit_interval == 0 and step < t.train_iters)
        periodic = (t.save_interval and step % t.save_interval == 0) or agreed.save_due
        if stopping or periodic or (t.save and step == t.train_iters):
            self.save(step, consumed)
        return stopping

    def save(self, step: int, consumed: int) -> None:
        """Collective: commits a checkpoint of this step on every rank."""
        engine = self.job.engine
        rs = engine.checkpoint_state(rng_state(self.job.model.ctx.tracker))
        meta = CheckpointMeta(step=step, consumed_samples=consumed, layout=self.job.layout,
                              saved_at=time.time(), optimizer=engine.checkpoint_meta(),
                              data=self.data)
        info = sharded.save(self.job.run.checkpoints, step, rs, meta, self.t.keep_last)
        gb, seconds = info["bytes"] / 1e9, info["seconds"]
        log.info("step %d: checkpoint committed, %.3f GB in %.2f s", step, gb, seconds)
        self._event(SaveEvent(step, seconds, gb, gb / seconds if seconds > 0 else None))
        self.deadline.save_took(seconds)
        self.clock.saved()

    def resume(self) -> Tuple[int, int]:
        """(step, consumed samples) of the checkpoint start-up chose, or (0, 0)."""
        resume = self.job.resume
        if resume is None:
            return 0, 0
        t0 = time.perf_counter()
        meta = self.load(resume.folder, resume.last_good)
        seconds = time.perf_counter() - t0
        saved, now = meta.layout.text(), self.job.layout.text()
        moved = "" if saved == now else f", written by {saved}, continued as {now}"
        log.info("resumed from %s at step %d (%d samples consumed%s); loaded %.3f GB checkpoint "
                 "in %.2f s", resume.folder, meta.step, meta.consumed_samples, moved,
                 meta.size_bytes() / 1e9, seconds)
        if resume.new_stream:
            log.info("the new sample stream starts at its first sample (training.new_data_stream)")
            return meta.step, 0
        return meta.step, meta.consumed_samples

    def load(self, folder: str, last_good: Optional[str]) -> CheckpointMeta:
        """Collective: fills the model, optimizer state, schedule and random streams from a
        committed checkpoint in any layout."""
        engine, state, tracker = self.job.engine, self.job.state, self.job.model.ctx.tracker
        meta, rng = sharded.load(folder, engine.checkpoint_state(rng=None), state.tp, state.pp,
                                 last_good)
        engine.restore_meta(meta.optimizer)
        if rng is not None:
            set_rng_state(rng, tracker)
        else:  # another TP or PP size: the streams cannot continue, so derive new ones
            reseed(tracker, self.seed + meta.step, state.tp_rank, state.pp_rank)
        return meta

    def last_good(self) -> Optional[Found]:
        """The newest complete checkpoint of this run, as rank 0 sees it (every rank gets it)."""
        return rank0_decides(lambda: self.job.run.continuation().found)

    def _expected_save(self) -> Tuple[float, str]:
        """(seconds, why) a save should take before this job has made one: the slowest of the
        run's last three saves (metrics.jsonl), else the bytes this rank will write over the
        disk's measured write speed. Never one step's time: a stop save that does not fit before
        the deadline loses the job's only checkpoint."""
        saves = events(read_metrics_tail(self.job.run.metrics), "save")[-3:]
        if saves:
            return max(e.seconds for e in saves), f"the run's last {len(saves)} save(s)"
        resume, engine, state = self.job.resume, self.job.engine, self.job.state
        if resume is not None:
            nbytes = resume.meta.size_bytes() / state.world_size  # the ranks write in parallel
        else:  # fp32 master and two Adam moments per element this rank owns
            shards = state.dp if self.job.ds_config["zero_optimization"]["stage"] > 0 else 1
            nbytes = 12.0 * engine.parameters_on_rank() / shards
        speed = _write_speed(self.job.run.checkpoints)
        return COMMIT_S + nbytes / speed, (f"{nbytes / 1e9:.2f} GB at {speed / 1e9:.2f} GB/s "
                                          "measured, plus the commit")

    def _event(self, record) -> None:
        if self.writer:
            self.writer.write(record)


PROBE_BYTES = 16 << 20
COMMIT_S = 1.0  # the gather, index and meta, rename: seconds at scale on a parallel file system


def _write_speed(folder: str) -> float:
    """Bytes per second of one flushed write of PROBE_BYTES into `folder` (done only when the
    run has a deadline and has not saved yet)."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f".write-probe-{os.getpid()}")
    data = os.urandom(PROBE_BYTES)  # incompressible, made before the clock starts
    t0 = time.perf_counter()
    try:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    finally:
        if os.path.exists(path):
            os.remove(path)
    return PROBE_BYTES / max(time.perf_counter() - t0, 1e-6)
