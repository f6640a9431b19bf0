#!/usr/bin/env python3
"""Every operator of one forward and backward, at the end-to-end benchmark's full shape, without a
GPU: the trainer's GPT and the peer's are run on torch's meta device (shapes only, no values)
under a dispatch mode that records each aten operator with the bytes it reads and writes and,
for the matrix products and attention, its FLOPs. A roofline prices each operator on a device
(`--device h200`: the measured copy rate and SDPA rate of benchmarks/results/gpu_h200.md, the
dense bf16 peak for the products) plus a launch floor, so the table says which operators a
step's time should go to and where the two programs move different bytes.

    python benchmarks/e2e/op_traffic.py [--layers 24] [--out benchmarks/results]

What it is not: a measurement. It sees the operators torch runs, not the kernels' speed (a
norm at 39% of the copy rate is priced at the copy rate), and nothing of the optimizer step,
DeepSpeed's gradient buffers or the host. Comparing its forward and backward total with a
profiled step's (benchmarks/e2e/profile_step.py) is what separates the model's own traffic
from the rest. The peer runs here with bf16 weights (autocast needs a real device), so its
casts of fp32 weights, which a real peer pays, are not in its total: it is the floor a plain
bf16 model of the same shape would reach.

The model is built with 1 and 2 layers and the difference taken as one layer (every layer is
the same operators); the table is the step at `--layers`.

`--engine` adds what the forward and backward leave out: the trainer itself (megatron-train on
this CPU, a 3.5M-parameter bf16 model, ZeRO-0 and ZeRO-1, one step recorded by this module as a
`--plugin`), its bytes per parameter split by who runs them (the model, the AdamW update,
DeepSpeed around it, the trainer's own checks), priced for the shape's parameter count."""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# The H200 as measured in benchmarks/results/gpu_h200.md (copy and SDPA rates) and its datasheet
# dense bf16 peak; a GEMM efficiency from the same run's peer (49% MFU over the whole step, its
# GEMMs faster than that); the launch floor is a typical small-kernel time on a recent GPU.
DEVICES = {"h200": {"copy_gbs": 4151.0, "gemm_tflops": 989.0 * 0.75, "sdpa_tflops": 457.0,
                    "launch_us": 4.0}}

DETAIL = False
FLASH = "flash_attention"  # the stand-in's name (and its "_backward"), priced at the SDPA rate
REFERENCE_ACTIVATIONS = os.environ.get("REFERENCE_ACTIVATIONS", "0") == "1"
VIEWS = {"view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "as_strided",
         "slice", "select", "unsqueeze", "squeeze", "detach", "alias", "split", "split_with_sizes",
         "unbind", "chunk", "narrow", "view_as", "_reshape_alias", "lift_fresh", "empty",
         "empty_strided", "empty_like", "new_empty", "new_empty_strided", "zeros_like",
         "ones_like", "_to_copy_noop"}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _gemm_flops(name: str, args) -> float:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if name in ("mm", "bmm"):
        a, b = tensors[0], tensors[1]
    elif name in ("addmm", "baddbmm"):
        a, b = tensors[1], tensors[2]
    else:
        return 0.0
    batch = a.shape[0] if a.dim() == 3 else 1
    return 2.0 * batch * a.shape[-2] * a.shape[-1] * b.shape[-1]


def _attention_flops(q: torch.Tensor, k: torch.Tensor) -> float:
    """Causal attention's forward, q and k [b, heads, s, d]: 4 b n s^2 d / 2 (the backward,
    _StandIn's, is 2.5 times it: flash recomputes the scores)."""
    b, n, s, d = q.shape
    return 4.0 * b * n * s * k.shape[-2] * d / 2


def _is_view(name: str) -> bool:
    return name in VIEWS or name.rstrip("_") in VIEWS


@dataclass
class Tally:
    calls: Dict[str, int] = field(default_factory=lambda: defaultdict(int))
    bytes: Dict[str, float] = field(default_factory=lambda: defaultdict(float))
    flops: Dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, name: str, nbytes: float, flops: float) -> None:
        self.calls[name] += 1
        self.bytes[name] += nbytes
        self.flops[name] += flops

    def plus(self, other: "Tally", times: int = 1) -> "Tally":
        """self + times x other, operator by operator."""
        out = Tally()
        for name in set(self.calls) | set(other.calls):
            out.calls[name] = self.calls[name] + times * other.calls[name]
            out.bytes[name] = self.bytes[name] + times * other.bytes[name]
            out.flops[name] = self.flops[name] + times * other.flops[name]
        return out


def _dtypes(name: str, ins, outs) -> str:
    """The operator's name with its inputs' and outputs' dtypes (DETAIL)."""
    dtypes = lambda ts: ",".join(str(t.dtype).replace("torch.", "") for t in ts)  # noqa: E731
    return f"{name} {dtypes(ins)}->{dtypes(outs)}"


class Recorder(TorchDispatchMode):
    """Every operator that is not a view into `tally`, under key(name, inputs, outputs): its
    name by default (its dtypes too with `detail`)."""

    def __init__(self, tally: Tally, detail: bool = False, key=None):
        super().__init__()
        self.tally = tally
        self.key = key or (_dtypes if detail else (lambda name, ins, outs: name))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name.split("::")[-1]
        if _is_view(name):
            return out
        ins = [a for a in tree_flatten((args, kwargs or {}))[0] if isinstance(a, torch.Tensor)]
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        self.tally.add(self.key(name, ins, outs), sum(_nbytes(t) for t in ins + outs),
                       _gemm_flops(name, ins))
        return out


class _StandIn(torch.autograd.Function):
    """A fused GPU kernel on the meta device: an output shaped like the first input; its bytes
    (every input and output once, forward; the incoming gradient, the inputs and their gradients,
    backward) and FLOPs go to the tally under `name`."""

    @staticmethod
    def forward(ctx, name, tally, flops, *inputs):
        ctx.name, ctx.tally, ctx.flops = name, tally, flops
        ctx.shapes = [(t.shape, t.dtype) for t in inputs]
        out = torch.empty_like(inputs[0])
        tally.add(name, sum(_nbytes(t) for t in inputs) + _nbytes(out), flops)
        return out

    @staticmethod
    def backward(ctx, grad):
        grads = [torch.empty(shape, dtype=dtype, device=grad.device) for shape, dtype in ctx.shapes]
        ctx.tally.add(ctx.name + "_backward", _nbytes(grad) + 2 * sum(_nbytes(g) for g in grads),
                      2.5 * ctx.flops)
        return (None, None, None, *grads)


class GpuChoices:
    """What a GPU run takes where the meta device would take another path: flash attention (one
    kernel each way) for torch SDPA, torch's own bf16 norms and activations (kernels.mode=torch
    on a GPU; the fused norm moves the same bytes), and with `fused` the one-pass bias-GeLU
    kernel. REFERENCE_ACTIVATIONS=1 keeps the fp32 reference activations (the torch path before
    the GPU took torch's own)."""

    def __init__(self, tally: Tally, fused: bool):
        self.tally, self.fused, self.saved = tally, fused, []

    def _set(self, owner, attr, value):
        self.saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)

    def __enter__(self):
        import torch.nn.functional as F
        from megatron.kernels import ops
        from megatron.kernels.builtin import activation, norm
        tally = self.tally

        def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False):
            return _StandIn.apply(FLASH, tally, _attention_flops(q, k), q, k, v)

        self._set(F, "scaled_dot_product_attention", sdpa)
        same_dtype = lambda x, *others: all(t is None or t.dtype == x.dtype for t in others)
        self._set(norm, "native_norm", same_dtype)
        if not REFERENCE_ACTIVATIONS:
            self._set(activation, "native_activation", same_dtype)
        if self.fused:
            dispatch = ops.dispatch

            def fused_gelu(name, sel, *args):
                if name != "bias_gelu":
                    return dispatch(name, sel, *args)
                return _StandIn.apply("bias_gelu(fused)", tally, 0.0, *args)

            self._set(ops, "dispatch", fused_gelu)
        return self

    def __exit__(self, *exc):
        for owner, attr, value in reversed(self.saved):
            setattr(owner, attr, value)


def _trainer_model(layers: int, shape) -> torch.nn.Module:
    """The trainer's GPT of `shape` with `layers` layers, on the meta device, in fp32."""
    from megatron.config import load_config
    from megatron.model import build_model
    from megatron.parallel.state import ParallelState
    cfg = load_config(str(ROOT / "examples/local/tiny.yaml"), [
        f"model.num_layers={layers}", f"model.hidden_size={shape.hidden}",
        f"model.num_attention_heads={shape.heads}", f"model.seq_length={shape.seq}",
        f"model.vocab_size={shape.vocab}", "model.attention_backend=sdpa",
        "model.hidden_dropout=0.0", "model.attention_dropout=0.0", "kernels.mode=torch"])
    with torch.device("meta"):
        return build_model(cfg, ParallelState.single(), shape.vocab)


def trainer_step(layers: int, shape, fused: bool = False) -> Tally:
    model = _trainer_model(layers, shape).to(torch.bfloat16)
    tokens = torch.zeros((shape.micro_batch, shape.seq), dtype=torch.long, device="meta")
    tally = Tally()
    with GpuChoices(tally, fused), Recorder(tally, DETAIL):
        loss = model(tokens, tokens)
        loss.backward()
    return tally


def peer_step(layers: int, shape) -> Tally:
    from peer_gpt import PeerGPT
    with torch.device("meta"):
        model = PeerGPT(layers, shape.hidden, shape.heads, shape.seq, shape.vocab)
    model = model.to(torch.bfloat16)
    tokens = torch.zeros((shape.micro_batch, shape.seq + 1), dtype=torch.long, device="meta")
    tally = Tally()
    with GpuChoices(tally, False), Recorder(tally, DETAIL):
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
    return tally


def parameters_at(layers: int, shape) -> int:
    """The trainer's GPT's parameter count at `layers` (from its 1- and 2-layer builds)."""
    one, two = (sum(p.numel() for p in _trainer_model(n, shape).parameters()) for n in (1, 2))
    return one + (layers - 1) * (two - one)


def at_layers(step, layers: int, shape) -> Tally:
    one, two = step(1, shape), step(2, shape)
    return one.plus(two.plus(one, -1), layers - 1)


def priced(tally: Tally, dev: dict) -> Dict[str, Tuple[int, float, float, float]]:
    """name -> (calls, GB, GFLOP, seconds by the roofline)."""
    rows = {}
    for name, calls in tally.calls.items():
        if calls == 0:
            continue
        nbytes, flops = tally.bytes[name], tally.flops[name]
        rate = dev["sdpa_tflops"] if name.startswith(FLASH) else dev["gemm_tflops"]
        seconds = max(flops / (rate * 1e12), nbytes / (dev["copy_gbs"] * 1e9)) \
            + calls * dev["launch_us"] * 1e-6
        rows[name] = (calls, nbytes / 1e9, flops / 1e9, seconds)
    return rows


def table(title: str, rows, top: int = 25) -> str:
    total = sum(r[3] for r in rows.values())
    lines = [f"### {title}: {total * 1e3:.1f} ms by the roofline, "
             f"{sum(r[0] for r in rows.values())} operators, "
             f"{sum(r[1] for r in rows.values()):.1f} GB moved", "",
             "| operator | calls | GB | TFLOP | ms | share |", "|---|---|---|---|---|---|"]
    for name, (calls, gb, gflop, sec) in sorted(rows.items(), key=lambda kv: -kv[1][3])[:top]:
        lines.append(f"| {name} | {calls} | {gb:.2f} | {gflop / 1e3:.2f} | {sec * 1e3:.2f} | "
                     f"{100 * sec / total:.1f}% |")
    return "\n".join(lines) + "\n"


# --engine: one step of megatron-train recorded by site (this module as a --plugin).
ENGINE_STEP = 6
ENGINE_MODEL = {"model.num_layers": 4, "model.hidden_size": 256, "model.num_attention_heads": 4,
                "model.seq_length": 128, "model.vocab_size": 1024,
                "model.attention_backend": "sdpa", "model.hidden_dropout": 0.0,
                "model.attention_dropout": 0.0,
                "training.precision": "bf16", "training.micro_batch_size": 2,
                "training.global_batch_size": 2, "training.train_iters": ENGINE_STEP + 1,
                "training.log_interval": 1, "training.tensorboard": "false",
                "optimizer.lr_warmup_iters": 0, "data.synthetic": "true", "kernels.mode": "torch"}


def _site_class(stack) -> str:
    """Who ran an operator, from the Python stack: the AdamW update (torch.optim), DeepSpeed
    around it (gradient buffers, norms, checks, copies), the trainer's checks, or the model's
    forward and backward (the backward's operators run under DeepSpeed's engine.backward)."""
    if any("/torch/optim/" in f.filename for f in stack):
        return "AdamW update"
    for frame in reversed(stack):
        f = frame.filename
        if "/torch/" in f or f.endswith("op_traffic.py"):
            continue
        if "/deepspeed/" in f:
            return "model" if frame.name == "backward" and f.endswith("runtime/engine.py") \
                else "DeepSpeed"
        if "/megatron/training/" in f or "/megatron/engine/" in f:
            return "trainer checks"
        return "model"
    return "model"


def _site_key(name, ins, outs) -> str:
    import traceback
    return _site_class(traceback.extract_stack()[:-2])


def _install_plugin(path: str) -> None:
    from megatron.training import loop
    original = loop._Loop._train_step

    def train_step(self):
        if self.step + 1 != ENGINE_STEP:
            return original(self)
        tally = Tally()
        with Recorder(tally, key=_site_key):
            result = original(self)
        Path(path).write_text(json.dumps({"calls": tally.calls, "bytes": tally.bytes}))
        return result

    loop._Loop._train_step = train_step


def engine_step(zero: int, work: Path) -> dict:
    import re
    import subprocess
    out = work / f"engine_zero{zero}.json"
    sets = dict(ENGINE_MODEL, **{"parallel.zero_stage": zero, "run.dir": str(work / f"z{zero}")})
    cmd = [sys.executable, "-m", "megatron.cli.train", "--plugin", "op_traffic"]
    cmd += [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    here = str(Path(__file__).resolve().parent)
    env = dict(os.environ, OP_TRAFFIC_STEP_OUT=str(out), OMP_NUM_THREADS="1",
               PYTHONPATH=here)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode or not out.exists():
        raise SystemExit(f"megatron-train (ZeRO-{zero}) failed: {proc.stderr[-2000:]}")
    found = re.search(r"training (\d+) parameters", proc.stdout + proc.stderr)
    return dict(json.loads(out.read_text()), parameters=int(found.group(1)))


def engine_table(results: Dict[int, dict], parameters: int, dev: dict) -> str:
    lines = [f"## Beside the forward and backward: bytes per parameter of one step of "
             f"megatron-train (bf16, one rank, this CPU), priced at {parameters / 1e9:.2f}B "
             "parameters", "",
             "| ZeRO | who | operators | bytes per parameter | ms at the copy rate |",
             "|---|---|---|---|---|"]
    for zero, result in sorted(results.items()):
        for who, calls in sorted(result["calls"].items()):
            per = result["bytes"][who] / result["parameters"]
            ms = "(its activations: the tables above)" if who == "model" else \
                f"{per * parameters / (dev['copy_gbs'] * 1e9) * 1e3:.1f}"
            lines.append(f"| {zero} | {who} | {calls} | {per:.1f} | {ms} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from bench_e2e import SHAPES
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="1.3b", choices=sorted(SHAPES))
    p.add_argument("--layers", type=int, help="layers of the priced step (default: the shape's)")
    p.add_argument("--device", default="h200", choices=sorted(DEVICES))
    p.add_argument("--out", help="folder for op_traffic_<device>.{json,md} (default: print)")
    p.add_argument("--engine", action="store_true",
                   help="also record one step of megatron-train at ZeRO-0 and 1 (about a minute)")
    args = p.parse_args(argv)
    shape, dev = SHAPES[args.shape], DEVICES[args.device]
    layers = args.layers or shape.layers
    runs = {"trainer, kernels.mode=torch": priced(at_layers(trainer_step, layers, shape), dev),
            "trainer, fused kernels": priced(at_layers(
                lambda n, sh: trainer_step(n, sh, fused=True), layers, shape), dev),
            "peer (bf16 weights)": priced(at_layers(peer_step, layers, shape), dev)}
    text = (f"# Forward and backward, operator by operator ({args.shape}, {layers} layers, "
            f"micro-batch {shape.micro_batch}, sequence {shape.seq}; roofline {args.device}: "
            f"{json.dumps(dev)})\n\n" + "\n".join(table(k, v) for k, v in runs.items()))
    engine = {}
    if args.engine:
        import tempfile
        with tempfile.TemporaryDirectory() as work:
            engine = {zero: engine_step(zero, Path(work)) for zero in (0, 1)}
        text += "\n" + engine_table(engine, parameters_at(layers, shape), dev)
    if args.out:
        out = Path(args.out)
        (out / f"op_traffic_{args.device}.md").write_text(text)
        (out / f"op_traffic_{args.device}.json").write_text(json.dumps(
            {k: {n: dict(zip(("calls", "gb", "gflop", "seconds"), r)) for n, r in v.items()}
             for k, v in runs.items()} | {f"engine_zero{z}": r for z, r in engine.items()},
            indent=1, sort_keys=True) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
elif os.environ.get("OP_TRAFFIC_STEP_OUT"):  # imported as megatron-train's plugin
    _install_plugin(os.environ["OP_TRAFFIC_STEP_OUT"])
