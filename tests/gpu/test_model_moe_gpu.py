"""Mixture of experts on one GPU, where the grouped GEMM's CUDA/ROCm kernel (never run on the
CPU machines) takes the experts' products:

- the experts' default path (grouped where grouped_gemm_works says it runs, else the loop) in
  bf16, fp16 and fp32 against an fp32 loop on the same weights: outputs and every gradient no
  further from it than the bf16/fp16/fp32 loop itself is, times two; in bf16 on a GPU of
  compute capability 9.0 or newer the grouped GEMM must be the path taken;
- a one-GPU training run of the MoE demo's shape (8 experts, top-2, sigmoid router with the
  bias update, a shared expert) in bf16 under ZeRO-1 on synthetic tokens: the loss falls and
  every layer's expert load is logged.

Training runs are subprocesses, as in test_training_gpu.py."""
import json
import os
import subprocess
import sys

import pytest
import torch

from megatron.config import load_config
from tests.support.paths import ROOT

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA or ROCm GPU; this machine has none")]

MOE = ["model.moe.num_experts=8", "model.moe.top_k=2", "model.moe.ffn_hidden_size=1024",
       "model.hidden_size=512", "model.num_attention_heads=8", "model.activation=swiglu",
       "model.add_bias_linear=false"]


def _experts():
    from megatron.model import build_context
    from megatron.model.moe.experts import Experts
    from megatron.parallel.state import ParallelState
    cfg = load_config(os.path.join(ROOT, "examples", "local", "tiny.yaml"), MOE)
    return Experts(cfg.model, build_context(cfg, ParallelState.single(), 512), 0, 0, 8)


def _run(experts, x, g, counts, grouped):
    experts.grouped = grouped
    experts.zero_grad(set_to_none=True)
    xi = x.clone().requires_grad_(True)
    experts(xi, counts).backward(g)
    return [experts(x, counts).detach().float(), xi.grad.float()] + \
        [p.grad.float() for p in experts.parameters()]


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_experts_default_path_on_the_gpu_is_as_close_as_the_loop(dtype):
    from megatron.model.moe.experts import grouped_gemm_works
    torch.manual_seed(0)
    experts = _experts().cuda()
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0, 0.02)
    counts = [300, 0, 17, 512, 64, 128, 1, 2]  # uneven, one expert idle, one with a single row
    x = torch.randn(sum(counts), 512, device="cuda")
    g = torch.randn(sum(counts), 512, device="cuda")
    reference = _run(experts, x, g, counts, grouped=False)  # fp32 loop
    low = experts.to(dtype)
    loop = _run(low, x.to(dtype), g.to(dtype), counts, grouped=False)
    default = _run(low, x.to(dtype), g.to(dtype), counts, grouped=None)
    why = grouped_gemm_works(x.device, dtype, 512, 2048, 1024)
    print(f"{dtype}: default path = {'grouped GEMM' if why is None else 'loop: ' + why}")
    for name, d, lp, ref in zip(["output", "input grad", "w1 grad", "w2 grad"], default, loop,
                                reference):
        floor = 1e-6 if dtype == torch.float32 else 1e-3
        assert _rel(d, ref) <= 2 * _rel(lp, ref) + floor, (name, _rel(d, ref), _rel(lp, ref))
    major, _ = torch.cuda.get_device_capability()
    if dtype == torch.bfloat16 and major >= 9 and not torch.version.hip:
        assert why is None, f"the grouped GEMM did not run in bf16 on this GPU: {why}"


def test_moe_trains_on_one_gpu_in_bf16(tmp_path):
    run_dir = tmp_path / "run"
    sets = ["data.synthetic=true", "training.precision=bf16", "parallel.zero_stage=1",
            "training.train_iters=40", "training.log_interval=1", "training.tensorboard=false",
            "eval.eval_interval=0", "checkpoint.save=false", f"run.dir={run_dir}"]
    cmd = [sys.executable, "-m", "megatron.cli.train", "--config", "examples/local/moe-tiny.yaml"]
    for item in sets:
        cmd += ["--set", item]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "step" in r and r.get("loss") is not None]
    assert [r["step"] for r in rows] == list(range(1, 41))
    assert rows[-1]["loss"] < rows[0]["loss"] - 0.5, [r["loss"] for r in rows]
    assert all(r["loss"] == r["loss"] for r in rows), "a NaN loss was logged"
    for r in rows:  # every layer's load on every step, no token dropped (dropless)
        assert len(r["moe"]) == 4, r.get("moe")
        assert all(m["tokens_per_expert_max"] >= m["tokens_per_expert_mean"] > 0 and
                   m["dropped_fraction"] == 0.0 for m in r["moe"]), r["moe"]
