"""Short real training runs of candidate layouts, and the JSON-lines store that makes a
calibration or search resumable.

The trainer contract (DESIGN.md): `python -m megatron.cli.train --config FILE --set k=v ...`
under torchrun writes `<run.dir>/metrics.jsonl`, one JSON object per logged step with `step`,
`step_time_s`, `tokens_per_sec`, `tflops_per_gpu` and `mem_gb`; evaluation lines carry
`"split": "valid"` and are ignored here."""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence

from megatron.base.records import RecordError, check_scalar_types, read_metrics, steps
from megatron.base.rundir import RunDir
from megatron.config import load_config, variants
from megatron.config.errors import InputError
from megatron.planner.emit import layout_config
from megatron.planner.layout import Job, Layout

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrialResult:
    key: str
    layout: Dict
    status: str                     # ok | failed | oom | timeout
    step_time_s: Optional[float] = None     # the fastest step after warm-up
    step_time_median_s: Optional[float] = None
    mem_gb: Optional[float] = None
    tokens_per_sec: Optional[float] = None
    tflops_per_gpu: Optional[float] = None
    steps: int = 0
    wall_s: float = 0.0
    error: str = ""
    job: str = ""                   # what was trained (calibrate.job_note), to keep jobs apart

    @property
    def ok(self) -> bool:
        return self.status == "ok" and bool(self.step_time_s)

    def to_layout(self) -> Layout:
        return Layout.from_dict(self.layout)


class TrialStore:
    """Append-only JSON lines; the last record of a layout wins when it is read back."""

    def __init__(self, path: Optional[str]):
        self.path = path

    def load(self) -> Dict[str, TrialResult]:
        if not self.path or not os.path.exists(self.path):
            return {}
        names = {f.name for f in dataclasses.fields(TrialResult)}
        out: Dict[str, TrialResult] = {}
        with open(self.path) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    raw = json.loads(line)
                    if not isinstance(raw, dict) or not isinstance(raw.get("layout"), dict):
                        raise RecordError("not a JSON object with a layout object")
                    check_scalar_types(TrialResult, raw, "it")
                    check_scalar_types(Layout, raw["layout"], "its layout")
                    rec = TrialResult(**{k: v for k, v in raw.items() if k in names})
                    rec.to_layout()  # a layout the planner can read back
                except (ValueError, TypeError, RecordError) as e:
                    log.warning("%s:%d is not a trial record (%s); skipped", self.path, lineno, e)
                    continue
                out[rec.key] = rec
        return out

    def append(self, rec: TrialResult) -> None:
        if not self.path:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(dataclasses.asdict(rec)) + "\n")


def summarize_metrics(path: str, warmup: int = 1,
                      tokens_per_step: Optional[int] = None) -> Dict[str, float]:
    """Step time and throughput after `warmup` steps, peak memory over all steps. The step
    time is the fastest step: other processes on a shared machine only ever slow a step down,
    so the minimum is the least disturbed estimate (the median is kept beside it). A log
    without step_time_s gets it from tokens_per_sec when tokens_per_step is known."""
    if not os.path.exists(path):
        raise InputError(f"the trainer wrote no {path}; the run failed before its first logged step")
    try:
        rows = steps(read_metrics(path))
    except RecordError as e:
        raise InputError(str(e)) from None
    timed = [r for r in rows if r.step > warmup] or rows[-1:]
    if not timed:
        raise InputError(f"{path} holds no training step")

    def values(of):
        return [float(of(r)) for r in timed if of(r) is not None]
    times = values(lambda r: r.step_time_s)
    if not times and tokens_per_step:
        times = [tokens_per_step / v for v in values(lambda r: r.tokens_per_sec) if v > 0]
    mems = [float(r.mem_gb) for r in rows if r.mem_gb is not None]
    tps, tflops = values(lambda r: r.tokens_per_sec), values(lambda r: r.tflops_per_gpu)
    return {"step_time_s": min(times) if times else None,
            "step_time_median_s": statistics.median(times) if times else None,
            "tokens_per_sec": max(tps) if tps else None,
            "tflops_per_gpu": max(tflops) if tflops else None,
            "mem_gb": max(mems) if mems else None, "steps": len(rows)}


def _error_lines(text: str) -> str:
    """The trainer's own error lines, not torchrun's traceback around them."""
    keep = [ln for ln in text.splitlines() if "error" in ln.lower() and "elastic" not in ln
            and not ln.lstrip().startswith(("File ", "Traceback", "raise ", "torch."))]
    return "\n".join(keep[-5:]) or text[-2000:]


class TorchrunRunner:
    """Runs one layout as `torchrun --standalone --nproc_per_node N -m megatron.cli.train` on a
    config file written per trial (the base config with the layout applied), so every value
    reaches the trainer typed as YAML rather than through --set parsing."""

    def __init__(self, config: str, job: Job, nproc: int, run_root: str, steps: int = 6,
                 overrides: Sequence[str] = (), timeout_s: float = 600, warmup: int = 2,
                 flash_backend: str = variants.AUTO, python: str = sys.executable,
                 job_note: str = ""):
        self.base = load_config(config, overrides)
        self.job, self.nproc, self.run_root = job, nproc, run_root
        self.steps, self.timeout_s, self.warmup = steps, timeout_s, warmup
        self.flash_backend, self.python, self.job_note = flash_backend, python, job_note

    def write_config(self, lay: Layout) -> str:
        run_dir = os.path.join(self.run_root, lay.key())
        cfg = layout_config(self.base, self.job, lay, self.flash_backend, run_dir)
        # a trial times the layout's whole batch: a batch-size ramp would time its first ones
        cfg.training = dataclasses.replace(cfg.training, train_iters=self.steps, log_interval=1,
                                           tensorboard=False, rampup_batch_size=None,
                                           train_samples=None)
        cfg.eval = dataclasses.replace(cfg.eval, eval_interval=0)
        cfg.checkpoint = dataclasses.replace(cfg.checkpoint, save=False, load=None)
        os.makedirs(self.run_root, exist_ok=True)
        path = os.path.join(self.run_root, f"{lay.key()}.yaml")
        with open(path, "w") as f:
            f.write(cfg.to_yaml())
        return path

    def command(self, config_path: str) -> List[str]:
        """The trial's launch; torchrun's agents log under the trials' folder (without
        --log-dir each leaves a torchelastic_* folder in the temporary directory)."""
        return [self.python, "-m", "torch.distributed.run", "--standalone",
                f"--nproc_per_node={self.nproc}",
                f"--log-dir={os.path.join(self.run_root, 'agent-logs')}",
                "-m", "megatron.cli.train", "--config", config_path]

    def run(self, lay: Layout) -> TrialResult:
        return dataclasses.replace(self._run(lay), job=self.job_note)

    def _run(self, lay: Layout) -> TrialResult:
        cmd = self.command(self.write_config(lay))
        run_dir = os.path.join(self.run_root, lay.key())
        metrics = fresh_trial_dir(run_dir)
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self.nproc)))
        start = time.time()
        log.info("trial %s: %s", lay.key(), " ".join(cmd))
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                  timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            return TrialResult(lay.key(), lay.to_dict(), "timeout", wall_s=time.time() - start,
                               error=f"no result within {self.timeout_s:.0f} s")
        wall = time.time() - start
        if proc.returncode != 0:
            text = (proc.stderr or "") + (proc.stdout or "")
            status = "oom" if "out of memory" in text.lower() else "failed"
            return TrialResult(lay.key(), lay.to_dict(), status, wall_s=wall,
                               error=_error_lines(text))
        tokens = lay.global_batch * self.job.seq
        try:
            summary = summarize_metrics(metrics, self.warmup, tokens)
        except (InputError, ValueError) as e:
            return TrialResult(lay.key(), lay.to_dict(), "failed", wall_s=wall, error=str(e))
        return TrialResult(lay.key(), lay.to_dict(), "ok", wall_s=wall, **summary)


def fresh_trial_dir(run_dir: str) -> str:
    """A trial's run directory (the planner's own, one per layout) without what an earlier attempt
    left: its metrics.jsonl (the trainer appends; a rerun must not read the old attempt) and any
    checkpoint a stop signal saved (a trial starts afresh, and the trainer refuses a fresh start
    below a complete checkpoint of its run.dir). Returns the metrics path."""
    run = RunDir(run_dir)
    if os.path.exists(run.metrics):
        os.remove(run.metrics)
    shutil.rmtree(run.checkpoints, ignore_errors=True)
    return run.metrics


def run_trials(runner, layouts: Iterable[Layout], store: TrialStore) -> Dict[str, TrialResult]:
    """Runs every layout not already in the store; returns all stored results."""
    done = store.load()
    for lay in layouts:
        if lay.key() in done:
            log.info("trial %s: already measured, skipped", lay.key())
            continue
        rec = runner.run(lay)
        log.info("trial %s: %s %s", lay.key(), rec.status,
                 f"{rec.step_time_s:.3f} s/step" if rec.ok else rec.error[-200:])
        store.append(rec)
        done[rec.key] = rec
    return done
