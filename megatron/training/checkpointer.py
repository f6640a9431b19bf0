"""The checkpointer owns when a run saves and what a save or a load does: the step interval
(checkpoint.save_interval), the wall clock (save_interval_minutes), the deadline (the job's end,
exit_duration_minutes), the stop requests (signals, exit_interval) and the final save; the save
itself, the resume chosen at start-up, and loading an older checkpoint for a rollback. The loop
asks it after each step; nothing else decides about saves.

With checkpoint.async_save a save blocks the loop only to start a snapshot of each rank's state
into host buffers kept from save to save (checkpoint/snapshot.py); a writer thread per rank
streams and fsyncs its file while training goes on. The copy runs alongside the next step's
forward and backward: an optimizer step pre-hook (torch's, so every DeepSpeed wrapper's inner
AdamW is covered) waits for it before the state changes. Each rank's writer state rides on the
per-step agreement (agree.py, no extra collective); once every rank's writer is done, the ranks
commit together with the usual protocol (sharded.PendingSave.finish), once any failed, the
run ends with that rank's message. At most one save is in flight: the next save, a stop, the
end of training and a rollback wait for it to commit.

A thread, not a process: the writer holds the GIL only for torch.save's few hundred Python-level
calls per file (the bytes move in os.write and fsync, which release it); a process would need
the snapshot in shared memory (the same copy) and a second interpreter, and gives back nothing
on the resource the two compete for, the CPU's cores and memory bandwidth."""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections import deque
from typing import List, Optional, Tuple

from torch.optim.optimizer import register_optimizer_step_pre_hook

from megatron.base import store
from megatron.checkpoint import sharded
from megatron.checkpoint.layout import data_record, rng_state, set_rng_state
from megatron.base.records import (BatchSizeEvent, CheckpointMeta, LrScheduleEvent, SaveEvent,
                                   StopEvent, events, read_metrics_tail)
from megatron.checkpoint.snapshot import Buffers, memory_shortfall, snapshot_bytes
from megatron.base.store import Found, committed_message, tag_for
from megatron.config import Config
from megatron.config.errors import InputError
from megatron.config.sections.optimizer import counts_samples
from megatron.engine.optimizer import schedule_change
from megatron.parallel.agree import rank0_decides
from megatron.parallel.random import reseed
from megatron.training.agree import (WRITER_BUSY, WRITER_DONE, WRITER_FAILED, WRITER_IDLE,
                                     Decisions)
from megatron.training.clock import Deadline, SaveClock
from megatron.training.startup import Job

log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(self, cfg: Config, job: Job, writer, started: float, watchdog=None):
        """writer: rank 0's MetricsWriter (None elsewhere); started: Unix time the run began
        (the deadline counts start-up too); watchdog: the hang watchdog (watchdog.py), told
        when a save or a load really happens (enter) and what a save should cost (expect):
        the run's last saves, else the estimate of an unmeasured one, then this job's saves."""
        self.t, self.ck, self.seed = cfg.training, cfg.checkpoint, cfg.training.seed
        self.opt = cfg.optimizer
        self.job, self.writer, self.watchdog = job, writer, watchdog
        self.phase = watchdog.enter if watchdog is not None else (lambda name: None)
        self.data = data_record(cfg)
        self.clock = SaveClock(self.ck.save_interval_minutes)
        self.deadline = Deadline(self.t.exit_duration_minutes, started,
                                 reserve=self.t.exit_reserve_seconds)
        self.saves: deque = deque(maxlen=3)  # this job's last saves, seconds from start to commit
        if self.deadline.at is not None or (watchdog is not None and watchdog.on):
            expected = rank0_decides(self._expected_save)  # one probe, the same on every rank
            if expected is not None:
                if self.deadline.at is not None and job.launch.rank == 0:
                    self.deadline.expect_save(*expected)
                self._expect(expected[0])
        self.pending: Optional[sharded.PendingSave] = None  # the save in flight
        self.blocked = 0.0  # seconds the loop has waited for it so far
        self.background: Optional[bool] = None if self.ck.async_save else False
        self.buffers = Buffers() if self.ck.async_save else None
        self._hook = register_optimizer_step_pre_hook(self._before_update) \
            if self.ck.async_save else None

    def due(self, step_seconds: float, growth: float = 1.0) -> Tuple[bool, bool]:
        """(a save is due by the clock, the deadline is reached), as this rank sees them after a
        step of `step_seconds` (the deadline keeps room for one more step, the wait for a save
        in flight, and a save). growth: the next step's batch over this one's
        (Deadline.step_took)."""
        self.deadline.step_took(step_seconds, growth)
        self.deadline.in_flight = self.deadline.save_estimate() if self.pending else 0.0
        return self.clock.due(), self.deadline.reached()

    def writer_state(self) -> int:
        """This rank's background writer, for the agreement (agree.WRITER_*)."""
        p = self.pending
        if p is None:
            return WRITER_IDLE
        if p.busy():
            return WRITER_BUSY
        return WRITER_FAILED if p.failed() else WRITER_DONE

    def after_step(self, step: int, consumed: int, agreed: Decisions) -> bool:
        """Saves when a save is due or the run stops here; True when it stops."""
        t, ck = self.t, self.ck
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
        periodic = (ck.save_interval and step % ck.save_interval == 0) or agreed.save_due
        if self.pending is not None and agreed.writer in (WRITER_DONE, WRITER_FAILED):
            self.wait()  # every rank's writer is done (or one failed): commit (or fail) now
        if stopping or periodic or (ck.save and step == t.train_iters):
            self.save(step, consumed)
        if stopping or step >= t.train_iters:
            self.wait()  # a run ends only once its last save is committed
        return stopping

    def save(self, step: int, consumed: int) -> None:
        """Collective: a checkpoint of this step, committed on every rank before this returns,
        or, asynchronously, once every rank's writer is done."""
        self.wait()  # at most one save in flight
        self.phase("save")
        t0 = time.perf_counter()
        engine = self.job.engine
        rs = engine.checkpoint_state(rng_state(self.job.model.ctx.tracker))
        meta = CheckpointMeta(step=step, consumed_samples=consumed, layout=self.job.layout,
                              saved_at=time.time(), optimizer=engine.checkpoint_meta(),
                              data=self.data)
        background, local = self._in_background(rs), self.ck.save_local_dir
        pending = sharded.PendingSave(self.job.run.checkpoints, step, rs, meta,
                                      self.ck.keep_last, self.buffers if background else None,
                                      local)
        self.clock.saved()
        if background or local:  # a synchronous save to the local tier drains in the background
            if not background:
                pending.write_local()
            pending.start_writer()
            self.pending, self.blocked = pending, time.perf_counter() - t0
            return
        pending.write()
        info = pending.finish()
        self._committed(step, info, info["seconds"], 0.0)

    def wait(self) -> None:
        """Collective when a save is in flight: waits for this rank's writer, then commits with
        every rank (or raises the failure of one, on every rank)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        self.phase("save")  # the commit's collectives
        t0 = time.perf_counter()
        pending.join()
        info = pending.finish()
        blocking = self.blocked + time.perf_counter() - t0
        self._committed(pending.step, info, blocking, pending.write_s)

    def close(self) -> None:
        """Local: the end of this run's checkpointer; a save still in flight (the run failed)
        is left uncommitted, its staging folder never read."""
        self.pending = None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _before_update(self, *_) -> None:
        """Before any optimizer step: the snapshot in flight must be copied out first."""
        pending = self.pending
        if pending is not None:
            t0 = time.perf_counter()
            pending.wait_copied()
            self.blocked += time.perf_counter() - t0

    def _in_background(self, rs) -> bool:
        """Whether this save runs in the background: asynchronous saves are on and host memory
        holds the snapshot (asked once, before the first: the buffers are kept after it)."""
        if self.background is None:
            needed = snapshot_bytes(rs)
            missing, share = memory_shortfall(needed, self.job.launch.ranks_per_node)
            self.background = missing == 0
            if missing:
                log.warning("checkpoint.async_save: host memory is %.2f GB short of a snapshot "
                            "of this rank's state (%.2f GB: 12 bytes per element it owns, "
                            "plus the writer's; this rank's share of the node's available "
                            "memory is %.2f GB); saving synchronously", missing / 1e9,
                            needed / 1e9, share / 1e9)
        return self.background

    def _committed(self, step: int, info, blocking: float, background: float) -> None:
        gb, seconds = info["bytes"] / 1e9, info["seconds"]
        log.info("step %d: checkpoint committed, %.3f GB in %.2f s (the loop waited %.2f s)",
                 step, gb, seconds, blocking)
        self.deadline.save_took(seconds)
        self.saves.append(seconds)
        self._expect(max(self.saves))
        try:
            self._event(SaveEvent(step, seconds, gb, gb / seconds if seconds > 0 else None,
                                  round(blocking, 4), round(background, 4)))
        except (OSError, InputError) as e:  # past the commit point: the step is there
            folder = os.path.join(self.job.run.checkpoints, tag_for(step))
            raise InputError(committed_message(folder, f"its save record could not be "
                                                       f"written: {e}")) from None

    def resume(self) -> Tuple[int, int]:
        """(step, consumed samples) of the checkpoint start-up chose, or (0, 0)."""
        if self.job.rolled_back is not None:  # checkpoint.roll_back moved newer ones aside
            self._event(self.job.rolled_back)
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
            log.info("the new sample stream starts at its first sample (checkpoint.new_data_stream)")
            self._resume_notes(meta)
            return meta.step, 0
        change = batch_size_change(meta, self.t,
                                   "samples" if counts_samples(self.opt) else "steps")
        if change is not None:
            event, text = change
            log.warning("%s", text)
            self._event(event)
        self._resume_notes(meta)
        return meta.step, meta.consumed_samples

    def _resume_notes(self, meta: CheckpointMeta) -> None:
        """What the resumed run will do that its settings alone do not say: nothing (no step
        left), or train on another learning-rate schedule than the checkpoint's."""
        if meta.step >= self.t.train_iters:  # no step left to train under either schedule
            log.info("nothing left to train: the checkpoint is at step %d and "
                     "training.train_iters=%d (raise it to train further)", meta.step,
                     self.t.train_iters)
            return
        change = schedule_change(meta.optimizer.scheduler, self.opt, self.t, meta.consumed_samples)
        if change is not None:
            changed, before, after, text = change
            log.warning("%s", text)
            self._event(LrScheduleEvent(meta.step, "; ".join(
                f"{k} {a} -> {b}" for k, (a, b) in changed.items()), before, after))

    def load(self, folder: str, last_good: Optional[str]) -> CheckpointMeta:
        """Collective: fills the model, optimizer state, schedule and random streams from a
        committed checkpoint in any layout."""
        self.phase("load")
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
        """The newest complete checkpoint of this run, as rank 0 sees it (every rank gets it),
        once the save in flight has committed."""
        self.wait()
        return rank0_decides(lambda: self.job.run.continuation().found)

    def _expect(self, seconds: float) -> None:
        if self.watchdog is not None:
            self.watchdog.expect("save", seconds)

    def _expected_save(self) -> Optional[Tuple[float, str]]:
        """(seconds, why) a save should take before this job has made one: the slowest of the
        run's last three saves (metrics.jsonl), else the bytes this rank will write over the
        disk's measured write speed plus the fsyncs a save makes in series (store.SAVE_FSYNCS)
        at their measured latency, plus the commit's collectives. Never one step's time: a stop
        save that does not fit before the deadline loses the job's only checkpoint. None when
        the checkpoint folder cannot be probed (the first save says why)."""
        saves = events(read_metrics_tail(self.job.run.metrics), "save")[-3:]
        if saves:
            return max(e.seconds for e in saves), f"the run's last {len(saves)} save(s)"
        resume, engine, state = self.job.resume, self.job.engine, self.job.state
        if resume is not None:
            nbytes = resume.meta.size_bytes() / state.world_size  # the ranks write in parallel
        else:  # fp32 master and two Adam moments per element this rank owns
            shards = state.dp_cp if self.job.ds_config["zero_optimization"]["stage"] > 0 else 1
            nbytes = 12.0 * engine.parameters_on_rank() / shards
        try:
            speed, fsync_s = probe_storage(self.job.run.checkpoints)
        except (OSError, InputError) as e:  # a full or read-only disk: the first save says so
            log.warning("could not probe %s for the cost of a save (%s)", self.job.run.checkpoints,
                        e)
            return None
        files = store.SAVE_FSYNCS * fsync_s
        return COMMIT_S + nbytes / speed + files, (
            f"{nbytes / 1e9:.2f} GB at {speed / 1e9:.2f} GB/s measured, plus the commit and "
            f"{store.SAVE_FSYNCS} fsyncs in series at {fsync_s:.3f} s each measured")

    def _event(self, record) -> None:
        if self.writer:
            self.writer.write(record)


def batch_size_change(meta: CheckpointMeta, t, lr_counts: str = "steps"
                      ) -> Optional[Tuple[BatchSizeEvent, str]]:
    """What a resume with another training.global_batch_size or rampup_batch_size (t: this
    run's training section; lr_counts: what the LR schedule counts, steps or samples) does to
    the data position (the event and one line for the log), or None when both are the
    checkpoint's. A checkpoint that did not record its batch size
    counts as changed when its consumed samples are not its steps times this run's batch."""
    data = meta.data
    before = data.global_batch_size if data is not None else None
    ramp_before = data.rampup_batch_size if data is not None else None
    gbs, ramp, done, step = t.global_batch_size, t.rampup_batch_size, meta.consumed_samples, \
        meta.step
    if ramp_before == ramp and (before == gbs or (before is None and done == step * gbs)):
        return None
    left = max(t.train_iters - step, 0)
    samples = t.samples_over(done, left)
    event = BatchSizeEvent(step, done, before, gbs, left, samples, ramp_before=ramp_before,
                           ramp=ramp)
    what = " and ".join(f"training.{name}" for name, changed in (
        ("global_batch_size", before != gbs), ("rampup_batch_size", ramp_before != ramp))
        if changed)
    then = ""
    if before:
        saved = dataclasses.replace(t, global_batch_size=before, rampup_batch_size=ramp_before)
        then = f" (at the checkpoint's batch size: {saved.samples_over(done, left)})"
    first = t.global_batch_at(done)
    per_step = (f"{first} samples a step on the ramp to {gbs}" if first < gbs
                else f"{gbs} samples a step")
    steps = f"steps {step + 1} to {t.train_iters}" if left else "no step"
    return event, (
        f"{what} changed on resume: {_batch_text(gbs, ramp)} now, the checkpoint's was "
        f"{_batch_text(before, ramp_before)}. "
        f"The checkpoint consumed {done} samples in {step} steps; the data continues at sample "
        f"{done}, {per_step}, none skipped or repeated; the LR schedule continues by "
        f"{lr_counts}, step numbers by steps: {steps} of training.train_iters={t.train_iters} "
        f"({left} steps) take {samples} samples{then}"
        + (f", samples {done} to {done + samples - 1}" if left else ""))


def _batch_text(gbs: Optional[int], ramp: Optional[List[int]]) -> str:
    if gbs is None:
        return "not recorded in it"
    return f"{gbs}" if ramp is None else f"{gbs} after the ramp {ramp}"


PROBE_BYTES = 16 << 20
COMMIT_S = 1.0  # the commit's gather and broadcast: seconds at scale


def probe_storage(folder: str) -> Tuple[float, float]:
    """(bytes per second, seconds per fsync) of `folder`'s storage, measured once at start-up on
    rank 0: one small file written as a save writes its index (write, fsync, rename, fsync of
    the folder: two fsyncs), then PROBE_BYTES flushed, whose time less one fsync is the
    transfer. On a loaded parallel file system the fsyncs, not the bytes, are what a small
    checkpoint's save costs. The folder is removed again if the probe made it."""
    made = not os.path.isdir(folder)
    os.makedirs(folder, exist_ok=True)
    small, big = (os.path.join(folder, f".{n}-probe-{os.getpid()}") for n in ("file", "write"))
    data = os.urandom(PROBE_BYTES)  # incompressible, made before the clock starts
    try:
        t0 = time.perf_counter()
        store.write_durable(small, b"x" * 4096, "the storage probe")
        fsync_s = (time.perf_counter() - t0) / 2
        t0 = time.perf_counter()
        with open(big, "wb") as f:
            f.write(data)
            f.flush()
            store.fsync(f.fileno())
        transfer = max(time.perf_counter() - t0 - fsync_s, 1e-6)
    finally:
        for path in (small, big):
            store.remove_quietly(path)
        if made:
            os.rmdir(folder)
    return PROBE_BYTES / transfer, fsync_s
