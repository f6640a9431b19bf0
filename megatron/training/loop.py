"""The training loop: set up the job, train, evaluate, log, checkpoint, stop cleanly on signals."""
from __future__ import annotations

import time

_IMPORTS_BEGAN = time.time()  # the start-up log counts this module's imports (torch) apart

import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from datetime import timedelta  # noqa: E402
from typing import Any, Dict, List, Optional, Tuple  # noqa: E402

import torch
import torch.distributed as dist

from megatron.config import Config, ConfigError, validate_for_world
from megatron.config.errors import Diverged
from megatron.config.validate import check_device
from megatron.data import build_iterators, tokenizer_vocab_size
from megatron.data.vocab import padded_vocab_size
from megatron.launch import detect_device, discover, init_distributed
from megatron.launch.startup import StartupTimer
from megatron.parallel.state import ParallelState
from megatron.checkpoint import sharded, store
from megatron.checkpoint.layout import (Resume, check_model, find_resume, layout_record,
                                        layout_text, rng_state, set_rng_state)
from megatron.checkpoint.rundir import RunLock, check_run_dir
from megatron.parallel.agree import rank0_decides
from megatron.training.clock import Deadline, SaveClock
from megatron.training.health import ROLLBACK, STOP, DivergenceGuard, Verdict
from megatron.parallel.random import reseed
from megatron.engine.deepspeed_json import deepspeed_config
from megatron.engine.engine import Engine
from megatron.training.metrics import MetricsWriter, memory_gb, mfu, model_flops_per_token

log = logging.getLogger(__name__)
_IMPORTS_DONE = time.time()
_first_run_in_process = True


@dataclass
class RunSummary:
    run_dir: str
    steps: int
    losses: List[float] = field(default_factory=list)
    valid_losses: List[float] = field(default_factory=list)
    step_times: List[float] = field(default_factory=list)
    stopped_early: bool = False
    test_loss: Optional[float] = None
    # Whole loop iterations (the step and everything after it: agreement, evaluation, saves,
    # metrics), wall and process CPU seconds; what the trainer benchmark compares with peers.
    iteration_times: List[float] = field(default_factory=list)
    iteration_cpu_times: List[float] = field(default_factory=list)
    startup: Dict[str, Any] = field(default_factory=dict)  # StartupTimer.record()


class _StopFlag:
    """SIGTERM / SIGUSR1 (Slurm's warning before the time limit) ask for a checkpoint and a clean
    exit at the next step boundary; every rank agrees through one tiny all-reduce."""

    def __init__(self):
        self.raised = False
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            try:
                signal.signal(sig, self._handler)
            except ValueError:  # not the main thread (tests driving train() from a thread)
                pass

    def _handler(self, signum, frame):
        log.warning("signal %d received: checkpointing and stopping after this step", signum)
        self.raised = True



def _write_run_files(cfg: Config, dp: int, device_type: str) -> None:
    """config.yaml (the file to resume with) is replaced only once the run has started: a start
    that fails leaves the previous one in place. Written whole, then renamed."""
    ds = deepspeed_config(cfg, dp, device_type)
    for name, text in (("config.yaml", cfg.to_yaml()), ("deepspeed.json", json.dumps(ds, indent=2))):
        path = os.path.join(cfg.run.dir, name)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _evaluate(cfg, engine: Engine, batches, step: int, writer, split: str = "valid"
              ) -> Optional[float]:
    if batches is None:
        return None
    it = batches()
    losses = [engine.eval_step(it) for _ in range(cfg.training.eval_iters)]
    loss = sum(losses) / len(losses)
    if writer:
        writer.write({"step": step, "split": split, "loss": loss})
    log.info("step %d %s loss %.4f", step, "validation" if split == "valid" else split, loss)
    return loss


def _save(cfg, job: "_Job", step: int, consumed: int, writer) -> float:
    """Commits a checkpoint of this step on every rank; returns the seconds it took."""
    engine = job.engine
    rs = engine.checkpoint_state(rng_state(engine.tracker))
    meta = {"step": step, "consumed_samples": consumed, "layout": job.layout,
            "saved_at": time.time(), **engine.checkpoint_meta()}
    info = sharded.save(os.path.join(cfg.run.dir, "checkpoints"), step, rs, meta,
                        cfg.training.keep_last)
    gb = info["bytes"] / 1e9
    log.info("step %d: checkpoint committed, %.3f GB in %.2f s", step, gb, info["seconds"])
    if writer:
        writer.write({"event": "save", "step": step, "seconds": info["seconds"], "gb": gb,
                      "gb_per_s": gb / info["seconds"] if info["seconds"] > 0 else None})
    return info["seconds"]


@dataclass
class _Job:
    """What _start sets up for train()."""
    launch: Any
    device_info: Any
    state: ParallelState
    dp: int
    text_vocab: int  # the tokenizer's vocabulary
    vocab: int       # the model's, padded for TP
    layout: dict     # written into each checkpoint (checkpoint.layout.layout_record)
    resume: Optional[Resume]  # the checkpoint to continue from, if any
    engine: Engine
    lock: Optional[RunLock]  # rank 0's hold on run.dir


def _start(cfg: Config, timer: StartupTimer) -> _Job:
    """Joins the job and builds the engine; `timer` gets a mark per phase."""
    launch = discover()
    device_info = detect_device(launch.local_rank)
    # Validate before joining the process group: a bad layout must fail fast on every rank,
    # not leave some ranks waiting in a rendezvous.
    dp = validate_for_world(cfg, launch.world_size)
    check_device(cfg, device_info.device.type)
    if cfg.training.init_from is not None and not os.path.isfile(cfg.training.init_from):
        raise ConfigError("training.init_from", cfg.training.init_from,
                          "an existing single-file model", "write one with megatron-convert "
                          "to-single --run-dir <run> --output <file>")
    tp = cfg.parallel.tensor_parallel_size
    timer.mark("device")
    text_vocab = tokenizer_vocab_size(cfg)
    vocab = padded_vocab_size(text_vocab, cfg.model.make_vocab_size_divisible_by, tp)
    layout = layout_record(cfg, dp, vocab, text_vocab)
    timer.mark("tokenizer")
    init_distributed(launch, device_info, timeout_s=60 * cfg.parallel.timeout_minutes)
    timer.mark("process group")
    lock = _claim_run_dir(cfg, launch.rank)
    try:
        resume = _agreed_resume(cfg, layout)
        timer.mark("run directory")
        state = ParallelState.build(tp, cfg.parallel.pipeline_parallel_size,
                                    timedelta(minutes=cfg.parallel.timeout_minutes))
        timer.mark("parallel groups")
        init = cfg.training.init_from
        if init is not None and resume is not None:
            log.info("training.init_from=%s is not used: this run resumes from its checkpoint",
                     init)
            init = None
        engine = Engine(cfg, state, vocab, device_info.device, dp,
                        init_text_vocab=text_vocab if init is not None else None, startup=timer)
    except BaseException:
        if lock:
            lock.release()
        raise
    log.info("training %d parameters on rank 0 (tp=%d pp=%d dp=%d, attention=%s)",
             engine.parameters_on_rank(), state.tp, state.pp, dp, engine.backend)
    return _Job(launch, device_info, state, dp, text_vocab, vocab, layout, resume, engine, lock)


def _claim_run_dir(cfg: Config, rank: int) -> Optional[RunLock]:
    """Rank 0 checks run.dir and takes its lock before anything is written there."""
    lock = RunLock(cfg.run.dir) if rank == 0 else None

    def claim():
        check_run_dir(cfg.run.dir)
        lock.acquire()
    rank0_decides(claim)
    return lock


def _agreed_resume(cfg: Config, layout: dict) -> Optional[Resume]:
    """The checkpoint every rank continues from, chosen once by rank 0."""
    def choose():
        resume = find_resume(cfg)
        if resume is not None:
            check_model(resume, layout)
        return resume
    return rank0_decides(choose)


def _load_into(job: _Job, cfg: Config, folder: str, last_good: Optional[str]) -> dict:
    """Fills the model, optimizer state, schedule and random streams from a committed
    checkpoint in any layout; returns its meta.json."""
    engine = job.engine
    rs = engine.checkpoint_state(rng=None)
    meta, rng = sharded.load(folder, rs, job.state.tp, job.state.pp, last_good)
    engine.restore_meta(meta)
    if rng is not None:
        set_rng_state(rng, engine.tracker)
    else:  # another TP or PP size: the streams cannot continue, so derive new ones
        reseed(engine.tracker, cfg.training.seed + int(meta["step"]), job.state.tp_rank,
               job.state.pp_rank)
    return meta


def _resume(job: _Job, cfg: Config) -> Tuple[int, int]:
    """(step, consumed samples) of the checkpoint _start chose, or (0, 0)."""
    resume = job.resume
    if resume is None:
        return 0, 0
    t0 = time.perf_counter()
    meta = _load_into(job, cfg, resume.folder, resume.last_good)
    seconds = time.perf_counter() - t0
    saved = meta["layout"]
    moved = "" if layout_text(saved) == layout_text(job.layout) else \
        f", written by {layout_text(saved)}, continued as {layout_text(job.layout)}"
    gb = sum(meta["files"].values()) / 1e9
    log.info("resumed from %s at step %d (%d samples consumed%s); loaded %.3f GB checkpoint in "
             "%.2f s", resume.folder, meta["step"], meta["consumed_samples"], moved, gb, seconds)
    return int(meta["step"]), int(meta["consumed_samples"])


def _last_good(cfg: Config):
    """The newest complete checkpoint of this run (store.Found) or None, as rank 0 sees it."""
    return rank0_decides(lambda: store.newest_complete(
        os.path.join(cfg.run.dir, "checkpoints"))[0])


def _diverged(cfg: Config, step: int, reason: str, writer) -> None:
    """Stops the run without saving: the diverged state is never committed."""
    found = _last_good(cfg)
    where = (f"the last good checkpoint is {found.folder} (step {found.step}); continue from it "
             "with training.load=auto, e.g. with a lower optimizer.lr" if found else
             "no checkpoint was saved before it")
    if writer:
        writer.write({"event": "diverged", "step": step, "reason": reason})
        writer.close()
    raise Diverged(f"training stopped: {reason}; nothing was saved after it, {where}")


def _roll_back(cfg: Config, job: _Job, step: int, reason: str, done: int, writer) -> int:
    """Reloads the newest checkpoint and returns its step; the data stream goes on from where it
    is, so the batches since that checkpoint (the spike's among them) are skipped."""
    if done >= cfg.training.max_rollbacks:
        _diverged(cfg, step, f"{reason}, after {done} rollbacks (training.max_rollbacks)", writer)
    found = _last_good(cfg)
    if found is None:
        _diverged(cfg, step, f"{reason}, and there is no checkpoint to roll back to", writer)
    back = int(_load_into(job, cfg, found.folder, None)["step"])
    log.warning("%s: rolled back to %s; the batches of steps %d-%d are skipped", reason,
                found.folder, back + 1, step)
    if writer:
        writer.write({"event": "rollback", "step": step, "to_step": back, "reason": reason})
    return back


def _record(step: int, result, dt: float, step_flops: float, tokens: int, world: int,
            peak: Optional[float], device) -> dict:
    tflops = step_flops / dt / world / 1e12
    return {"step": step, "loss": result.loss, "lr": result.lr, "grad_norm": result.grad_norm,
            "tokens_per_sec": tokens / dt, "tflops_per_gpu": tflops, "mfu": mfu(tflops, peak),
            "mem_gb": memory_gb(device), "loss_scale": result.loss_scale,
            "skipped": result.skipped, "step_time_s": dt}


def _decisions(stop: _StopFlag, clock: SaveClock, deadline: Deadline, verdict: Verdict,
               device) -> Tuple[bool, bool, bool, int]:
    """(stop signalled, save due, deadline reached, guard action), agreed by every rank in one
    small all-reduce; the clocks are rank 0's, the guard's action the most severe of any rank."""
    rank0 = dist.get_rank() == 0
    mine = (stop.raised, rank0 and clock.due(), rank0 and deadline.reached(), verdict.action)
    if dist.get_world_size() == 1:  # nobody to agree with: the same answer without a collective
        return bool(mine[0]), bool(mine[1]), bool(mine[2]), int(mine[3])
    flags = torch.tensor([float(x) for x in mine], device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return bool(flags[0].item()), bool(flags[1].item()), bool(flags[2].item()), int(flags[3])


def _startup_timer(started: float) -> StartupTimer:
    """Counts from the process's launch for the first run in a process (the entry points), from
    `started` for any later one (tests and tools that train several times in one process)."""
    global _first_run_in_process
    if not _first_run_in_process:
        return StartupTimer(started)
    _first_run_in_process = False
    timer = StartupTimer()
    timer.mark("python and CLI", _IMPORTS_BEGAN)
    timer.mark("imports", _IMPORTS_DONE)
    timer.mark("other", started)
    return timer


def train(cfg: Config) -> RunSummary:
    started = time.time()  # exit_duration_minutes counts start-up too
    timer = _startup_timer(started)
    job = _start(cfg, timer)
    try:
        return _train(cfg, job, started, timer)
    finally:
        if job.lock:
            job.lock.release()


def _train(cfg: Config, job: _Job, started: float, timer: StartupTimer) -> RunSummary:
    step, consumed = _resume(job, cfg)
    if job.resume is not None:
        timer.mark("checkpoint load")
    data = build_iterators(cfg, job.state.dp_rank, job.dp, consumed, vocab_size=job.text_vocab)
    timer.mark("data")
    if job.launch.rank == 0:
        _write_run_files(cfg, job.dp, job.device_info.device.type)
    loop = _Loop(cfg, job, started, step, consumed)
    timer.mark("run files and metrics")
    return loop.run(data, timer)


class _Loop:
    """One run of the training loop: steps, and after each the decisions every rank agrees on
    (divergence, signals, clocks) and what follows from them (rollback, save, stop)."""

    def __init__(self, cfg: Config, job: _Job, started: float, step: int, consumed: int):
        t = cfg.training
        self.cfg, self.job, self.t, self.step, self.consumed = cfg, job, t, step, consumed
        self.device = job.device_info.device
        self.writer = MetricsWriter(cfg.run.dir, t.tensorboard) if job.launch.rank == 0 else None
        self.summary = RunSummary(cfg.run.dir, step)
        self.tokens_step = t.global_batch_size * cfg.model.seq_length
        self.step_flops = model_flops_per_token(cfg.model, job.vocab) * self.tokens_step
        self.peak = t.peak_tflops or job.device_info.peak_tflops
        self.stop, self.clock = _StopFlag(), SaveClock(t.save_interval_minutes)
        self.deadline = Deadline(t.exit_duration_minutes, started)
        self.guard, self.rollbacks = DivergenceGuard(t, t.precision == "fp16"), 0
        self.startup: Optional[StartupTimer] = None
        self._startup_written = False

    def run(self, data, startup: Optional[StartupTimer] = None) -> RunSummary:
        t, summary = self.t, self.summary
        self.startup = startup
        while self.step < t.train_iters:
            wall, cpu = time.perf_counter(), time.process_time()
            stopping = self._iteration(data)
            summary.iteration_times.append(time.perf_counter() - wall)
            summary.iteration_cpu_times.append(time.process_time() - cpu)
            if stopping:
                summary.stopped_early = True
                break
        summary.steps = self.step
        if t.eval_interval and not summary.stopped_early:
            summary.test_loss = _evaluate(self.cfg, self.job.engine, data.test, self.step,
                                          self.writer, "test")
        if self.writer:
            self.writer.close()
        return summary

    def _iteration(self, data) -> bool:
        """One step and what follows from it; True when the run stops here."""
        result = self._train_step(data.train)
        verdict = self.guard.observe(self.step, result.loss, result.skipped)
        signalled, clock_due, out_of_time, action = _decisions(
            self.stop, self.clock, self.deadline, verdict, self.device)
        if self._guarded(verdict, action):
            return False
        if self.t.eval_interval and self.step % self.t.eval_interval == 0:
            self.summary.valid_losses.append(_evaluate(self.cfg, self.job.engine, data.valid,
                                                       self.step, self.writer))
        return self._checkpoint(signalled, clock_due, out_of_time)

    def _train_step(self, batches):
        _sync(self.device)
        t0 = time.perf_counter()
        result = self.job.engine.train_step(batches)
        _sync(self.device)
        dt = time.perf_counter() - t0
        self.deadline.step_took(dt)
        self.step += 1
        self.consumed += self.t.global_batch_size
        self.summary.losses.append(result.loss)
        self.summary.step_times.append(dt)
        if self.startup is not None and not self.summary.startup:
            self.summary.startup = dict(self.startup.record(), first_step_s=round(dt, 3))
            log.info("start-up: %s; the first step took %.2f s", self.startup.text(), dt)
        if self.writer and self.step % self.t.log_interval == 0:
            record = _record(self.step, result, dt, self.step_flops, self.tokens_step,
                             self.job.launch.world_size, self.peak, self.device)
            if self.summary.startup and not self._startup_written:
                record["startup"] = self.summary.startup
                self._startup_written = True
            self.writer.write(record)
            log.info("step %d loss %.4f lr %.3g %.3fs", self.step, result.loss, result.lr, dt)
        return result

    def _guarded(self, verdict: Verdict, action: int) -> bool:
        """Acts on the divergence guard's agreed action; True when the step was rolled back."""
        reason = verdict.reason or f"step {self.step}: another rank found the run diverged"
        if action == STOP:
            _diverged(self.cfg, self.step, reason, self.writer)
        if action == ROLLBACK:
            self.step = _roll_back(self.cfg, self.job, self.step, reason, self.rollbacks,
                                   self.writer)
            self.rollbacks += 1
            self.guard.rolled_back()
            return True
        if verdict.spike:
            log.warning("loss spike: %s", verdict.reason)
            if self.writer:
                self.writer.write({"event": "spike", "step": self.step, "reason": verdict.reason})
        return False

    def _checkpoint(self, signalled: bool, clock_due: bool, out_of_time: bool) -> bool:
        """Saves when a save is due or the run stops here; True when it stops."""
        t, step = self.t, self.step
        out_of_time = out_of_time and step < t.train_iters
        if out_of_time:
            log.warning("stopping after step %d with a checkpoint: %s", step,
                        self.deadline.reason())
            if self.writer:
                self.writer.write({"event": "stop", "step": step, "reason": "deadline"})
        stopping = signalled or out_of_time or bool(
            t.exit_interval and step % t.exit_interval == 0 and step < t.train_iters)
        periodic = (t.save_interval and step % t.save_interval == 0) or clock_due
        if stopping or periodic or (t.save and step == t.train_iters):
            self.deadline.save_took(_save(self.cfg, self.job, step, self.consumed, self.writer))
            self.clock.saved()
        return stopping
