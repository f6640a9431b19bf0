"""Model FLOPs, MFU, memory, and the metrics.jsonl / TensorBoard / W&B writers and the human log
line of each record (log_line.py)."""
from __future__ import annotations

import json
import logging
import os
import resource
import time
from typing import Dict, List, Optional

import yaml

import torch
import torch.distributed as dist

from megatron.base import store
from megatron.base.records import (MetricsRecord, RecordError, StepRecord, is_number,
                                         parse_metrics_bytes, record_json, strict_json_record)
from megatron.base.rundir import RunDir
from megatron.config.model_math import model_flops_per_token  # noqa: F401 (re-exported)
from megatron.training.log_line import LogLines
from megatron.training.wandb_log import WandbLogger

log = logging.getLogger(__name__)


def memory_gb(device: torch.device) -> float:
    """Peak allocated device memory on a GPU; peak resident set size of the process on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB -> GiB


class MetricsWriter:
    """Appends one record (base/records.py) per line of metrics.jsonl; mirrors scalars to
    TensorBoard when available and to W&B with run.wandb; logs each record as one line for a
    person (log_line.py). cfg: the run's Config; when not given, it is read from the run's
    config.yaml at the first record (the loop writes that file before any step)."""

    def __init__(self, run: RunDir, tensorboard: bool, cfg=None):
        os.makedirs(run.path, exist_ok=True)
        self.run, self.cfg, self.started = run, cfg, None
        self.path = run.metrics
        set_aside_damaged_tail(run)  # else the first record would continue a crash's last line
        self.file = open(self.path, "a", buffering=1)
        self.lines: Optional[LogLines] = None
        self.wandb: Optional[WandbLogger] = None
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self.tb = SummaryWriter(run.tensorboard)
            except ImportError:
                log.warning("tensorboard is not installed; metrics go to metrics.jsonl only "
                            "(pip install tensorboard)")
        self.started = time.monotonic()

    def write(self, record: MetricsRecord) -> None:
        """One line of strict JSON: non-finite numbers are written as null and named in
        "nonfinite". TensorBoard and W&B get the true values, so a diverged loss shows there as
        NaN."""
        if self.lines is None:
            self._open_mirrors()
        obj = record_json(record)
        line, _ = strict_json_record(obj)
        text = json.dumps(line, allow_nan=False) + "\n"
        try:
            self.file.write(text)
        except OSError as e:
            self._failed(e, len(text.encode()))
        if self.tb is not None:
            prefix = getattr(record, "split", "train")
            for key, value in obj.items():
                if is_number(value) and key != "step":
                    self.tb.add_scalar(f"{prefix}/{key}", float(value), record.step)
        if self.wandb is not None:
            self.wandb.write(record)
        log.info("%s", self.lines.line(record))

    def _open_mirrors(self) -> None:
        """At the first record: the config (for train_iters and run.wandb), then W&B."""
        cfg = self.cfg or _saved_config(self.run)
        total = cfg.training.train_iters if cfg is not None else None
        full = cfg.training.global_batch_size if cfg is not None else None
        self.lines = LogLines(total, self.started, full)
        if cfg is not None:
            self.wandb = WandbLogger.open(self.run, cfg.run, cfg.to_dict())

    def _failed(self, error: OSError, needed: int) -> None:
        """A write that failed (only then is this asked): the part of the line that reached the
        file is cut off, so metrics.jsonl stays whole lines; a full disk is one InputError."""
        try:
            self.file.close()  # its last flush fails again; the file is closed all the same
        except OSError:
            pass
        _cut_partial_line(self.path)
        full = store.disk_full(self.path, "a metrics line", error, needed)
        if full is None:
            raise error
        raise full from None

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wandb is not None:
            self.wandb.close()
            self.wandb = None


def _saved_config(run: RunDir):
    """The run's config.yaml as a Config, or None (a writer used outside a run, in tests)."""
    from megatron.config import Config
    try:
        with open(run.config) as f:
            return Config.from_dict(yaml.safe_load(f) or {})
    except (OSError, ValueError, TypeError, yaml.YAMLError) as e:
        log.debug("no readable %s (%s): log lines without the step total", run.config, e)
        return None


def _cut_partial_line(path: str) -> None:
    """Truncates `path` after its last newline."""
    try:
        with open(path, "rb+") as f:
            end = f.seek(0, os.SEEK_END)
            at = end
            while at > 0:
                start = max(0, at - 65536)
                f.seek(start)
                block = f.read(at - start)
                if b"\n" in block:
                    f.truncate(start + block.rindex(b"\n") + 1)
                    return
                at = start
            f.truncate(0)
    except OSError:
        pass


_BLOCK = 1 << 16  # bytes read at a time from the end of metrics.jsonl


def set_aside_damaged_tail(run: RunDir) -> None:
    """Before a run appends to its metrics.jsonl: what a crash left after the last record (a
    line a kill cut short, NUL bytes of blocks a node's crash left zero-filled, whole lines that
    are no record) is moved to RunDir.metrics_damaged and cut off, with one warning. Bad lines
    before the last record stay where they are: megatron-report names them."""
    try:
        f = open(run.metrics, "rb+")
    except FileNotFoundError:
        return
    with f:
        size = f.seek(0, os.SEEK_END)
        keep = _damage_start(f, size)
        if keep == size:
            return
        try:
            lines = _copy_tail(f, keep, size, run.metrics_damaged)
        except OSError as e:
            full = store.disk_full(run.metrics_damaged, "the damaged tail of metrics.jsonl", e,
                                   size - keep)
            if full is None:
                raise
            raise full from None
        f.truncate(keep)
    log.warning("%s ended in %d bytes (%d line%s) after its last whole record, left by a crash "
                "(a line cut short, zero-filled blocks); they are set aside in %s and the run "
                "appends after that record", run.metrics, size - keep, lines,
                "" if lines == 1 else "s", run.metrics_damaged)


def _damage_start(f, size: int) -> int:
    """Where the damaged tail begins: just after the last line that is a record (`size` when
    nothing but blank lines follows it; 0 when no line is one)."""
    end = _zeros_start(f, size)
    damaged = end < size
    for i, (at, raw) in enumerate(_lines_backward(f, end)):
        if not raw.strip():
            continue
        if i > 0 and _is_record(raw):  # i == 0: the bytes after the last newline, a cut line
            return at + len(raw) + 1 if damaged else size
        damaged = True
    return 0 if damaged else size


def _is_record(raw: bytes) -> bool:
    try:
        parse_metrics_bytes(raw, "a metrics line")
    except RecordError:
        return False
    return True


def _zeros_start(f, size: int) -> int:
    """Where the NUL bytes that end the file begin: a zero-filled tail may be large, so it is
    skipped a block at a time rather than read as one line."""
    end = size
    while end > 0:
        start = max(0, end - _BLOCK)
        f.seek(start)
        kept = f.read(end - start).rstrip(b"\0")
        if kept:
            return start + len(kept)
        end = start
    return 0


def _lines_backward(f, end: int):
    """(offset, bytes) of each line before `end`, the last first and without its newline; the
    first is what follows the last newline (b"" when `end` is just after one)."""
    pos, buf = end, b""
    while True:
        while b"\n" in buf:
            cut = buf.rindex(b"\n")
            yield pos + cut + 1, buf[cut + 1:]
            buf = buf[:cut]
        if pos == 0:
            yield 0, buf
            return
        start = max(0, pos - _BLOCK)
        f.seek(start)
        buf, pos = f.read(pos - start) + buf, start


def _copy_tail(f, start: int, end: int, dest: str) -> int:
    """Appends bytes [start, end) of `f` to `dest`, on disk before the caller cuts them off;
    how many lines they make."""
    lines, last = 0, b""
    f.seek(start)
    with open(dest, "ab") as out:
        while start < end:
            block = f.read(min(_BLOCK, end - start))
            if not block:
                break
            out.write(block)
            lines, last, start = lines + block.count(b"\n"), block[-1:], start + len(block)
        out.flush()
        os.fsync(out.fileno())
    return lines + (last != b"\n")


def mfu(tflops_per_gpu: float, peak: Optional[float]) -> Optional[float]:
    return None if not peak else tflops_per_gpu / peak


def moe_window(layers, state, cfg, step: int) -> Optional[List[Dict[str, float]]]:
    """At a logged step of a MoE model, the numbers of this rank's MoE layers (`layers`, the
    engine's list, in layer order) since the last one (model/moe/layer.MoELayer.take_stats),
    over the whole global batch; None otherwise or when none ran. Collective (every rank
    calls it after each step): the data-parallel replicas' micro-batches are summed, and
    under pipeline parallelism the stages' lists (each holds some layers) gathered."""
    if not cfg.model.moe.num_experts or step % cfg.training.log_interval:
        return None
    dp_group = state.dp_group if state.dp > 1 else None
    pp_group = state.pp_group if state.pp > 1 else None
    taken = [layer.take_stats() for layer in layers]
    taken = [t for t in taken if t is not None]
    if dp_group is not None:
        taken = [t.summed_over(dp_group) for t in taken]
    mine = [t.as_dict() for t in taken]
    if pp_group is not None:
        stages = [None] * dist.get_world_size(pp_group)
        dist.all_gather_object(stages, mine, group=pp_group)
        mine = [layer for stage in stages for layer in stage]
    return mine or None


def step_record(step: int, result, dt: float, flops_per_token: float, cfg, batch: int,
                world: int, peak: Optional[float], device: torch.device,
                moe: Optional[List[Dict[str, float]]] = None) -> StepRecord:
    """The metrics line of a step of `batch` samples of cfg's sequence length that took `dt`
    seconds (result: engine.StepResult); `moe`: moe_window's numbers, MoE runs only. Under a
    batch-size ramp (training.rampup_batch_size) the line carries the step's batch."""
    tokens = batch * cfg.model.seq_length
    tflops = flops_per_token * tokens / dt / world / 1e12
    ramp = batch if cfg.training.rampup_batch_size is not None else None
    return StepRecord(step=step, loss=result.loss, lr=result.lr, grad_norm=result.grad_norm,
                      tokens_per_sec=tokens / dt, tflops_per_gpu=tflops, mfu=mfu(tflops, peak),
                      mem_gb=memory_gb(device), loss_scale=result.loss_scale,
                      skipped=result.skipped, step_time_s=dt, moe=moe, global_batch_size=ramp)
