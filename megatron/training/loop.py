"""The training loop: set up the job, train, evaluate, log, checkpoint, stop cleanly on signals."""
from __future__ import annotations

import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

import torch
import torch.distributed as dist

from megatron.config import Config, ConfigError, deepspeed_config, validate_for_world
from megatron.config.validate import check_device
from megatron.data import build_iterators, tokenizer_vocab_size
from megatron.data.vocab import padded_vocab_size
from megatron.launch import detect_device, discover, init_distributed
from megatron.parallel.state import ParallelState
from megatron.training.checkpoint import (CheckpointState, check_resume_layout, find_resume,
                                         layout_record, rng_state, set_rng_state, write_layout)
from megatron.training.engine import Engine
from megatron.training.metrics import MetricsWriter, memory_gb, mfu, model_flops_per_token

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    run_dir: str
    steps: int
    losses: List[float] = field(default_factory=list)
    valid_losses: List[float] = field(default_factory=list)
    step_times: List[float] = field(default_factory=list)
    stopped_early: bool = False
    test_loss: Optional[float] = None


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

    def agreed(self, device) -> bool:
        flag = torch.tensor(1.0 if self.raised else 0.0, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def _write_run_files(cfg: Config, dp: int) -> None:
    os.makedirs(cfg.run.dir, exist_ok=True)
    with open(os.path.join(cfg.run.dir, "config.yaml"), "w") as f:
        f.write(cfg.to_yaml())
    with open(os.path.join(cfg.run.dir, "deepspeed.json"), "w") as f:
        json.dump(deepspeed_config(cfg, dp), f, indent=2)


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


def _save(cfg, engine: Engine, step: int, consumed: int, layout: dict) -> None:
    client = CheckpointState(step, consumed, rng_state(engine.tracker)).to_dict()
    directory, tag = os.path.join(cfg.run.dir, "checkpoints"), f"step_{step:07d}"
    engine.save(directory, tag, client)
    if dist.get_rank() == 0:
        write_layout(os.path.join(directory, tag), layout)


@dataclass
class _Job:
    """What _start sets up for train()."""
    launch: Any
    device_info: Any
    state: ParallelState
    dp: int
    text_vocab: int  # the tokenizer's vocabulary
    vocab: int       # the model's, padded for TP
    layout: dict     # written beside each checkpoint (checkpoint.layout_record)
    resume: Optional[Tuple[str, Optional[str]]]  # the checkpoint to continue from, if any
    engine: Engine


def _start(cfg: Config) -> _Job:
    """Joins the job and builds the engine."""
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
    text_vocab = tokenizer_vocab_size(cfg)
    vocab = padded_vocab_size(text_vocab, cfg.model.make_vocab_size_divisible_by, tp)
    layout = layout_record(cfg, dp, vocab)
    resume = find_resume(cfg)
    if resume is not None:
        # Before anything is written: a refused resume must leave the run directory as it was.
        check_resume_layout(*resume, layout)
    init_distributed(launch, device_info)
    state = ParallelState.build(tp, cfg.parallel.pipeline_parallel_size)
    if launch.rank == 0:
        _write_run_files(cfg, dp)
    init = cfg.training.init_from
    if init is not None and resume is not None:
        log.info("training.init_from=%s is not used: this run resumes from its checkpoint", init)
        init = None
    engine = Engine(cfg, state, vocab, device_info.device, dp,
                    init_text_vocab=text_vocab if init is not None else None)
    log.info("training %d parameters on rank 0 (tp=%d pp=%d dp=%d, attention=%s)",
             engine.parameters_on_rank(), state.tp, state.pp, dp, engine.backend)
    return _Job(launch, device_info, state, dp, text_vocab, vocab, layout, resume, engine)


def _resume(engine: Engine, resume: Optional[Tuple[str, Optional[str]]]):
    """(step, consumed samples) of the checkpoint `resume` (find_resume's), or (0, 0)."""
    client = engine.load(*resume) if resume is not None else None
    if not client:
        return 0, 0
    ck = CheckpointState.from_dict(client)
    set_rng_state(ck.rng, engine.tracker)
    log.info("resumed from %s at step %d (%d samples consumed)", resume[0], ck.step,
             ck.consumed_samples)
    return ck.step, ck.consumed_samples


def _record(step: int, result, dt: float, step_flops: float, tokens: int, world: int,
            peak: Optional[float], device) -> dict:
    tflops = step_flops / dt / world / 1e12
    return {"step": step, "loss": result.loss, "lr": result.lr, "grad_norm": result.grad_norm,
            "tokens_per_sec": tokens / dt, "tflops_per_gpu": tflops, "mfu": mfu(tflops, peak),
            "mem_gb": memory_gb(device), "loss_scale": result.loss_scale,
            "skipped": result.skipped, "step_time_s": dt}


def train(cfg: Config) -> RunSummary:
    job = _start(cfg)
    launch, device_info, engine = job.launch, job.device_info, job.engine
    device, t = device_info.device, cfg.training
    step, consumed = _resume(engine, job.resume)
    data = build_iterators(cfg, job.state.dp_rank, job.dp, consumed, vocab_size=job.text_vocab)
    writer = MetricsWriter(cfg.run.dir, t.tensorboard) if launch.rank == 0 else None
    summary = RunSummary(cfg.run.dir, step)
    tokens_step = t.global_batch_size * cfg.model.seq_length
    step_flops = model_flops_per_token(cfg.model, job.vocab) * tokens_step
    peak = t.peak_tflops or device_info.peak_tflops
    stop = _StopFlag()
    while step < t.train_iters:
        _sync(device)
        t0 = time.perf_counter()
        result = engine.train_step(data.train)
        _sync(device)
        dt = time.perf_counter() - t0
        step += 1
        consumed += t.global_batch_size
        summary.losses.append(result.loss)
        summary.step_times.append(dt)
        if writer and step % t.log_interval == 0:
            writer.write(_record(step, result, dt, step_flops, tokens_step, launch.world_size,
                                 peak, device))
            log.info("step %d loss %.4f lr %.3g %.3fs", step, result.loss, result.lr, dt)
        if t.eval_interval and step % t.eval_interval == 0:
            summary.valid_losses.append(_evaluate(cfg, engine, data.valid, step, writer))
        stopping = stop.agreed(device) or (
            t.exit_interval and step % t.exit_interval == 0 and step < t.train_iters)
        periodic = t.save_interval and step % t.save_interval == 0
        if stopping or periodic or (t.save and step == t.train_iters):
            _save(cfg, engine, step, consumed, job.layout)
        if stopping:
            summary.stopped_early = True
            break
    summary.steps = step
    if t.eval_interval and not summary.stopped_early:
        summary.test_loss = _evaluate(cfg, engine, data.test, step, writer, "test")
    if writer:
        writer.close()
    return summary
