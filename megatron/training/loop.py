"""The training loop. train() starts the run (startup.py), resumes it (checkpointer.py), and
steps until training.train_iters; after each step every rank agrees on what follows (agree.py):
the divergence guard's action (divergence.py), a stop signal (signals.py), the save clock and
the deadline (checkpointer.py). Metrics lines are the records of base/records.py."""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch

from megatron.base.records import EvalRecord, StartupRecord
from megatron.base.rundir import RunDir
from megatron.config import Config
from megatron.data import build_iterators
from megatron.launch.env import discover
from megatron.launch.startup import StartupTimer
from megatron.parallel.state import set_collective_timeout
from megatron.training.agree import Decisions, agree
from megatron.training.checkpointer import Checkpointer
from megatron.training.divergence import Divergence
from megatron.training.metrics import (MetricsWriter, model_flops_per_token, moe_window,
                                       step_record)
from megatron.training.sdc import Rerun
from megatron.training.signals import StopFlag
from megatron.training.startup import Job, start, write_run_files
from megatron.training.stragglers import Stragglers
from megatron.training.watchdog import Watchdog

log = logging.getLogger(__name__)


@dataclass
class Timing:
    """Where a run's time went, per step: the step itself, and the whole loop iteration (the
    step and everything after it: agreement, evaluation, saves, metrics) in wall and process CPU
    seconds; and the start-up phases (StartupTimer.record() and the first step)."""
    step_s: List[float] = field(default_factory=list)
    iteration_s: List[float] = field(default_factory=list)
    iteration_cpu_s: List[float] = field(default_factory=list)
    startup: Dict[str, Any] = field(default_factory=dict)


@dataclass
class RunSummary:
    run_dir: str
    steps: int
    losses: List[float] = field(default_factory=list)
    valid_losses: List[float] = field(default_factory=list)
    stopped_early: bool = False
    test_loss: Optional[float] = None
    timing: Timing = field(default_factory=Timing)


def train(cfg: Config, startup: Optional[StartupTimer] = None) -> RunSummary:
    """Trains cfg's run. startup: the timer the entry point started at launch (its marks for the
    interpreter and imports come first); by default start-up counts from this call. Joins the
    process group if it is not joined (launch.init_distributed); it stays joined for another run
    in this process, and launch.leave_distributed ends it."""
    started = time.time()  # exit_duration_minutes counts start-up too
    timer = startup if startup is not None else StartupTimer(started)
    r = cfg.resilience
    with Watchdog(RunDir(cfg.run.dir), discover().rank, 60 * r.startup_timeout_minutes,
                  60 * r.hang_timeout_minutes) as watchdog:
        job = start(cfg, timer)
        watchdog.join(job.nodes, job.started_at, set_collective_timeout,
                      60 * cfg.parallel.timeout_minutes)
        try:
            with StopFlag() as stop:
                return _Loop(cfg, job, started, stop, watchdog).run(timer)
        finally:
            job.close()


class _Loop:
    """One run of the loop: a step, then what every rank agreed follows from it."""

    def __init__(self, cfg: Config, job: Job, started: float, stop: StopFlag, watchdog: Watchdog):
        t = self.t = cfg.training
        r, self.eval = cfg.resilience, cfg.eval
        self.cfg, self.job, self.stop, self.device = cfg, job, stop, job.device
        self.watchdog = watchdog
        self.writer = MetricsWriter(job.run, t.tensorboard, cfg) if job.launch.rank == 0 else None
        self.checkpointer = Checkpointer(cfg, job, self.writer, started, watchdog)
        self.divergence = Divergence(r, t.precision == "fp16", self.checkpointer, self.writer)
        self.rerun = Rerun(self.divergence.guard, job.model.ctx.tracker, job.nodes,
                           job.launch.rank) if r.rerun_suspect_steps else None
        self.stragglers = Stragglers(r, job.engine, job.state.pp > 1, job.device, job.nodes,
                                     self.writer)
        self.flops_token = model_flops_per_token(cfg.model, job.vocab)
        self.peak = t.peak_tflops or job.device_info.peak_tflops
        self.step = self.consumed = 0
        self.summary, self.startup_written = RunSummary(cfg.run.dir, 0), False

    def run(self, timer: StartupTimer) -> RunSummary:
        try:
            self._begin(timer)
            while self.step < self.t.train_iters and not self.summary.stopped_early:
                wall, cpu = time.perf_counter(), time.process_time()
                self.summary.stopped_early = self._iteration()
                self.summary.timing.iteration_s.append(time.perf_counter() - wall)
                self.summary.timing.iteration_cpu_s.append(time.process_time() - cpu)
            self.summary.steps = self.step
            if self.eval.eval_interval and not self.summary.stopped_early:
                self.summary.test_loss = self._evaluate(self.data.test, "test")
            return self.summary
        finally:
            self.checkpointer.close()
            if self.writer:
                self.writer.close()

    def _begin(self, timer: StartupTimer) -> None:
        job = self.job
        self.watchdog.enter("load")
        self.step, self.consumed = self.checkpointer.resume()
        self.watchdog.done()
        self.summary.steps = self.step
        if job.resume is not None:
            timer.mark("checkpoint load")
        self.data = build_iterators(self.cfg, job.state.dp_rank, job.dp, self.consumed,
                                    job.text_vocab, self.step)
        timer.mark("data")
        write_run_files(job, self.cfg)
        timer.mark("run files and metrics")
        self.timer = timer

    def _iteration(self) -> bool:
        """One step and what follows from it; True when the run stops here."""
        dog = self.watchdog
        dog.enter("step", self.step + 1)
        result, dt = self._train_step()
        dog.enter("agreement")
        self.stragglers.after_step(self.step)
        verdict = self.divergence.observe(self.step, result.loss, result.skipped)
        save_due, out_of_time = self.checkpointer.due(dt, self.t.global_batch_at(self.consumed)
                                                      / self.last_batch)
        agreed = agree(Decisions(self.stop.raised, save_due, out_of_time, verdict.action,
                                 self.checkpointer.writer_state()), self.device)
        dog.done()
        dog.enter("guard")  # a rollback's load enters "load" (checkpointer.py)
        back = self.divergence.act(self.step, verdict, agreed.action)
        dog.done()
        if back is not None:
            self.step = back
            return False
        if self.eval.eval_interval and self.step % self.eval.eval_interval == 0:
            dog.enter("evaluation")
            self.summary.valid_losses.append(self._evaluate(self.data.valid, "valid"))
            dog.done()
        dog.enter("after-step")  # a save enters "save" (checkpointer.py)
        stopping = self.checkpointer.after_step(self.step, self.consumed, agreed)
        dog.done()
        return stopping

    def _train_step(self):
        _sync(self.device)
        t0 = time.perf_counter()
        rerun = self.rerun.for_step(self.step + 1) if self.rerun else None
        batch = self.last_batch = self.t.global_batch_at(self.consumed)  # a ramp's, or the batch
        result = self.job.engine.train_step(self.data.train, rerun, self.step + 1, batch)
        _sync(self.device)
        dt = time.perf_counter() - t0
        self.watchdog.done()
        if result.withheld:
            self.divergence.silent_data_error(result.suspect, self.job.run)
        self.step += 1
        self.consumed += batch
        self.summary.losses.append(result.loss)
        self.summary.timing.step_s.append(dt)
        if not self.summary.timing.startup:
            self.summary.timing.startup = dict(self.timer.record(), first_step_s=round(dt, 3))
            log.info("start-up: %s; the first step took %.2f s", self.timer.text(), dt)
        moe = moe_window(self.job.engine.moe_layers, self.job.state, self.cfg, self.step)
        if self.writer and self.step % self.t.log_interval == 0:
            record = step_record(self.step, result, dt, self.flops_token, self.cfg, batch,
                                 self.job.launch.world_size, self.peak, self.device, moe)
            if not self.startup_written:  # the first line written carries the start-up
                startup = StartupRecord.from_json(self.summary.timing.startup)
                record = dataclasses.replace(record, startup=startup)
                self.startup_written = True
            self.writer.write(record)  # and its log line (training/log_line.py)
        return result, dt

    def _evaluate(self, batches, split: str) -> Optional[float]:
        if batches is None:
            return None
        it = batches()
        losses = [self.job.engine.eval_step(it) for _ in range(self.eval.eval_iters)]
        loss = sum(losses) / len(losses)
        if self.writer:
            self.writer.write(EvalRecord(self.step, split, loss))
        return loss


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
