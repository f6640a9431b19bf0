#!/usr/bin/env python3
"""End-to-end training throughput on one GPU: this project's trainer against plain PyTorch.

    python benchmarks/e2e/bench_e2e.py [--out DIR] [--runs fused,torch,peer] [--tiny]

The GPT of about 1.3B parameters (24 layers, hidden 2048, 16 heads, sequence 2048, vocabulary
50304), bf16, one GPU, ZeRO-1, synthetic tokens, attention backend `auto` (flash-attn when it is
installed, else SDPA), no dropout. Runs, each in a process of its own (own CUDA context, own
peak-memory counter, a crash or hang costs that run only):
- fused: megatron-train with kernels.mode=fused (fails fast when the kernels are not built);
- torch: megatron-train with kernels.mode=torch (torch's native norms and activations);
- torch_zero0: the same under ZeRO-0 (at one data-parallel rank ZeRO-1 shards nothing, but
  DeepSpeed still flattens, copies and converts every gradient; benchmarks/results/gpu_h200.md);
- torch_bf16opt, fused_bf16opt: torch and fused with training.grad_accum_dtype=fp32, which
  DeepSpeed runs with its BF16_Optimizer (fp32 gradients in flat buffers, one update a group);
- peer: a plain PyTorch GPT of the same shape (peer_gpt.py; its docstring states its precision).
For each: the median step time after the warm-up steps, tokens/s, model TFLOP/s (the trainer's
formula, megatron.training.metrics.model_flops_per_token), MFU against the device's peak
(megatron.launch.device), peak memory (torch.cuda.max_memory_allocated; the resident set on a
CPU). Beside them the planner's prediction for the same layout (megatron.planner, what
`megatron-plan memory` prints) on the matching preset. Writes e2e_<device>.json and .md into
--out after every run, so an interrupted benchmark still leaves what it measured.

--tiny: a 2-layer shape that runs on a CPU in seconds, for dry runs and tests.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import e2e_plan  # noqa: E402
import e2e_report  # noqa: E402
from megatron.base.records import read_metrics, steps  # noqa: E402
from megatron.base.rundir import RunDir  # noqa: E402
from megatron.config import ModelConfig  # noqa: E402
from megatron.data.vocab import padded_vocab_size  # noqa: E402
from megatron.launch.device import lookup_peak  # noqa: E402
from megatron.training.metrics import model_flops_per_token  # noqa: E402

RUNS = ("fused", "torch", "peer", "torch_zero0", "torch_bf16opt", "fused_bf16opt")
# run name -> (kernels.mode, parallel.zero_stage, training.grad_accum_dtype) for this trainer's
# runs; fp32 accumulation at ZeRO-1 is DeepSpeed's BF16_Optimizer
MEGATRON_RUNS = {"fused": ("fused", 1, "model"), "torch": ("torch", 1, "model"),
                 "torch_zero0": ("torch", 0, "model"), "torch_bf16opt": ("torch", 1, "fp32"),
                 "fused_bf16opt": ("fused", 1, "fp32")}


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    micro_batch: int
    global_batch: int

    def model_config(self) -> ModelConfig:
        return ModelConfig(num_layers=self.layers, hidden_size=self.hidden,
                           num_attention_heads=self.heads, seq_length=self.seq,
                           vocab_size=self.vocab, attention_backend="auto")


SHAPES = {
    # The issue's 1.3B (GPT-3 XL's layers, hidden and heads; GPT-2's vocabulary padded to 128).
    # Micro-batch 8: about 53 GiB by the planner, near its best predicted MFU on one H200.
    "1.3b": Shape(24, 2048, 16, 2048, 50304, micro_batch=8, global_batch=8),
    "tiny": Shape(2, 64, 4, 64, 512, micro_batch=2, global_batch=4),
}


def megatron_overrides(shape: Shape, kernels: str, iters: int, run_dir: str,
                       zero: int = 1, grad_accum: str = "model") -> list:
    sets = {"model.num_layers": shape.layers, "model.hidden_size": shape.hidden,
            "model.num_attention_heads": shape.heads, "model.seq_length": shape.seq,
            "model.vocab_size": shape.vocab, "model.attention_backend": "auto",
            "model.hidden_dropout": 0.0, "model.attention_dropout": 0.0,
            "parallel.zero_stage": zero, "training.precision": "bf16",
            "training.grad_accum_dtype": grad_accum,
            "training.micro_batch_size": shape.micro_batch,
            "training.global_batch_size": shape.global_batch, "training.train_iters": iters,
            "training.log_interval": 1, "training.tensorboard": "false",
            "optimizer.lr_warmup_iters": 0, "data.synthetic": "true", "kernels.mode": kernels,
            "run.dir": run_dir}
    return [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]


def _run(cmd, timeout: float, log_path: Path, extra_env: Optional[dict] = None) -> Optional[str]:
    """Runs cmd from the repository root; None, or why it failed (the log's last lines)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra_env or {}))
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return f"timed out after {timeout:.0f}s"
    if proc.returncode:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-6:]
        return f"exit {proc.returncode}: " + " | ".join(tail)[-1500:]
    return None


def plugin_env() -> dict:
    """PYTHONPATH with this folder first, for megatron-train's --plugin of a module here."""
    here = str(Path(__file__).resolve().parent)
    return {"PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", ""))
                                          if p)}


def profile_env(work: Path, name: str, profile: bool) -> dict:
    """With --profile: the variable profile_step.py reads for this run (the trainer's plugin
    or the peer's), so the run writes profile-<name>.txt."""
    if not profile:
        return {}
    variable = "PEER_PROFILE_OUT" if name == "peer" else "MEGATRON_PROFILE_OUT"
    return dict(plugin_env(), **{variable: str(work / f"profile-{name}.txt")})


def run_megatron(shape: Shape, name: str, iters: int, work: Path, timeout: float,
                 profile: bool = False) -> dict:
    kernels, zero, grad_accum = MEGATRON_RUNS[name]
    run_dir = work / f"megatron-{name}"
    log_path = work / f"megatron-{name}.log"
    cmd = [sys.executable, "-m", "megatron.cli.train",
           *(["--plugin", "profile_step"] if profile else []),
           *megatron_overrides(shape, kernels, iters, str(run_dir), zero, grad_accum)]
    env = profile_env(work, name, profile)
    error = _run(cmd, timeout, log_path, env)
    metrics = RunDir(str(run_dir)).metrics
    rows = steps(read_metrics(metrics)) if os.path.exists(metrics) else []
    text = log_path.read_text(errors="replace")
    backend = re.search(r"attention=(\w+)\)", text)
    optimizer = re.search(r"DeepSpeed's optimizer: (\w+)", text)
    params = re.search(r"training (\d+) parameters", text)
    return {"step_times": [r.step_time_s for r in rows], "losses": [r.loss for r in rows],
            "peak_mem_gb": max((r.mem_gb for r in rows), default=None),
            "attention": backend.group(1) if backend else None,
            "parameters": int(params.group(1)) if params else None,
            "optimizer": optimizer.group(1) if optimizer else None,
            "precision_policy": (
                "DeepSpeed BF16_Optimizer (training.grad_accum_dtype=fp32): bf16 weights, fp32 "
                "gradients, master weights and AdamW states" if grad_accum == "fp32" else
                f"DeepSpeed bf16 + ZeRO-{zero}: bf16 weights and gradients, fp32 master weights "
                "and AdamW states") + " (torch AdamW, fused on a GPU), clip 1.0",
            "error": error}


def run_peer(shape: Shape, iters: int, device: str, work: Path, timeout: float,
             profile: bool = False) -> dict:
    spec = dict(asdict(shape), iters=iters, device=device)
    spec_path, result_path = work / "peer-spec.json", work / "peer-result.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "e2e" / "peer_gpt.py"), "--spec",
           str(spec_path), "--result", str(result_path)]
    error = _run(cmd, timeout, work / "peer.log", profile_env(work, "peer", profile))
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    result["error"] = error
    return result


def summarize(raw: dict, warmup: int, tokens_per_step: int, flops_per_step: float,
              peak_tflops: Optional[float]) -> dict:
    """Median over the steps after the warm-up (all steps when there are no more)."""
    times = raw.get("step_times") or []
    timed = times[warmup:] or times
    out = {k: v for k, v in raw.items() if k != "step_times"}
    out["status"] = "failed" if raw.get("error") else "ok"
    out["steps_timed"] = len(timed)
    out["step_times_s"] = [round(t, 4) for t in times]
    if not timed:
        return out
    step = statistics.median(timed)
    tflops = flops_per_step / step / 1e12
    out.update(step_time_s=step, tokens_per_s=tokens_per_step / step, tflops_per_gpu=tflops,
               mfu=tflops / peak_tflops if peak_tflops else None,
               loss_first=raw["losses"][0] if raw.get("losses") else None,
               loss_last=raw["losses"][-1] if raw.get("losses") else None)
    if out["status"] == "failed" and len(timed) >= 1:
        out["status"] = "partial"
    return out


def device_facts(args) -> dict:
    gpu = torch.cuda.is_available() and not args.cpu
    name = torch.cuda.get_device_name(0) if gpu else "cpu"
    try:
        from importlib.metadata import version
        ds = version("deepspeed")
    except Exception:  # noqa: BLE001 - only reported
        ds = None
    return {"device": "cuda" if gpu else "cpu", "name": name,
            "peak_tflops": args.peak_tflops or (lookup_peak(name) if gpu else None),
            "torch": torch.__version__, "cuda": torch.version.cuda, "hip": torch.version.hip,
            "deepspeed": ds, "python": sys.version.split()[0]}


def slug(name: str, tiny: bool) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") + ("_tiny" if tiny else "")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"),
                   help="results folder (default: $OUT, else benchmarks/results)")
    p.add_argument("--runs", default=",".join(RUNS[:3]),
                   help="comma-separated: fused, torch, peer, torch_zero0, torch_bf16opt, "
                        "fused_bf16opt (the last two: training.grad_accum_dtype=fp32, DeepSpeed's "
                        "BF16_Optimizer) (default: the first three)")
    p.add_argument("--tiny", action="store_true", help="the tiny shape (CPU dry run, tests)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is visible")
    p.add_argument("--micro-batch", type=int, help="sequences per micro-batch (default 8; tiny 2)")
    p.add_argument("--global-batch", type=int, help="sequences per step, a multiple of the "
                   "micro-batch (default 8; tiny 4)")
    p.add_argument("--warmup", type=int, help="steps left out of the median (default 3; tiny 1)")
    p.add_argument("--steps", type=int, help="timed steps (default 8; tiny 3)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per run (default 300)")
    p.add_argument("--peak-tflops", type=float, help="MFU denominator (default: the device's)")
    p.add_argument("--cluster", help="planner preset or profile YAML (default: the preset "
                   "matching the GPU; a probe of this machine on a CPU)")
    p.add_argument("--merge", action="store_true",
                   help="keep the runs an earlier invocation wrote into the same JSON")
    p.add_argument("--context", default="", help="a note stored with these runs "
                   "(e.g. 'kernel build running alongside')")
    p.add_argument("--work", help="folder for run directories and logs (default: a temp dir)")
    p.add_argument("--profile", action="store_true",
                   help="profile the sixth step of each run (profile_step.py) into "
                   "profile-<run>.txt in --work: kernels by device time, device busy against "
                   "wall; that step is slower, so give these runs an --out of their own")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = sorted(set(runs) - set(RUNS))
    if unknown:
        print(f"bench_e2e: unknown run(s) {unknown}; choose among {', '.join(RUNS)}",
              file=sys.stderr)
        return 2
    base = SHAPES["tiny" if args.tiny else "1.3b"]
    shape = Shape(**dict(asdict(base), micro_batch=args.micro_batch or base.micro_batch,
                         global_batch=args.global_batch or base.global_batch))
    if shape.micro_batch < 1 or shape.global_batch % shape.micro_batch:
        print(f"bench_e2e: --global-batch {shape.global_batch} must be a positive multiple of "
              f"--micro-batch {shape.micro_batch}", file=sys.stderr)
        return 2
    warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 3)
    steps = args.steps if args.steps is not None else (3 if args.tiny else 8)
    dev = device_facts(args)
    if dev["device"] == "cpu" and not args.tiny:
        print("bench_e2e: no GPU is visible to torch; the 1.3B shape needs one. Use --tiny for a "
              "CPU dry run.", file=sys.stderr)
        return 2
    if dev["device"] == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # --cpu: the subprocesses must not see the GPU
    model = shape.model_config()
    vocab = padded_vocab_size(shape.vocab, model.make_vocab_size_divisible_by, 1)
    tokens = shape.global_batch * shape.seq
    flops = model_flops_per_token(model, vocab) * tokens
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"e2e_{slug(dev['name'], args.tiny)}"
    previous = out / f"{stem}.json"
    result = json.loads(previous.read_text()) if args.merge and previous.exists() else {}
    result.update({
        "benchmark": "end-to-end training, one device", "tiny": args.tiny,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": dev,
        "shape": asdict(shape), "warmup_steps": warmup, "timed_steps": steps,
        "layout": {"tp": 1, "pp": 1, "dp": 1, "zero": 1, "precision": "bf16",
                   "grad_accum": shape.global_batch // shape.micro_batch, "recompute": "none"},
        "tokens_per_step": tokens, "model_flops_per_step": flops,
        "planner": e2e_plan.prediction(model, shape, dev, args.cluster)})
    result.setdefault("runs", {})
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_e2e_"))
    work.mkdir(parents=True, exist_ok=True)
    for name in runs:
        began = time.perf_counter()
        if MEGATRON_RUNS.get(name, ("",))[0] == "fused" and dev["device"] == "cpu":
            entry = {"status": "skipped", "reason": "the fused kernels run on GPUs only"}
        elif name == "peer":
            raw = run_peer(shape, warmup + steps, dev["device"], work, args.timeout,
                           args.profile)
            entry = summarize(raw, warmup, tokens, flops, dev["peak_tflops"])
        else:
            raw = run_megatron(shape, name, warmup + steps, work, args.timeout, args.profile)
            entry = summarize(raw, warmup, tokens, flops, dev["peak_tflops"])
            entry["kernels"], entry["zero_stage"], entry["grad_accum_dtype"] = \
                MEGATRON_RUNS[name]
        entry["wall_s"] = round(time.perf_counter() - began, 1)
        entry["context"] = args.context
        result["runs"][name] = entry
        e2e_report.write(out / stem, result)
        print(e2e_report.line(name, entry), flush=True)
    print(f"bench_e2e: wrote {out / stem}.json and .md")
    failed = [n for n in runs if result["runs"][n]["status"] in ("failed", "partial")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
