"""The end-to-end benchmark (benchmarks/e2e/bench_e2e.py) in its tiny CPU mode, as
`benchmarks/gpu_check.sh --dry-run` runs it: the trainer and the plain PyTorch peer train the same
shape, the JSON holds the fields the GPU run will report with values that follow from each other
(tokens/s and TFLOP/s from the median step, the trainer's FLOPs formula), the parameter counts of
trainer, peer and planner agree, and a second invocation with --merge keeps the first one's runs
(gpu_check.sh runs the peer while the kernels build, the fused run after). About 20 s."""
import json
import math
import subprocess
import sys

import pytest

from megatron.config import ModelConfig
from megatron.training.metrics import model_flops_per_token
from tests.e2e.e2e_helpers import ROOT, RunEnv

BENCH = f"{ROOT}/benchmarks/e2e/bench_e2e.py"


def _bench(env: RunEnv, out, work, *args):
    cmd = [sys.executable, BENCH, "--tiny", "--cpu", "--out", str(out), "--work", str(work),
           "--peak-tflops", "2.0", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env.env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads((out / "e2e_cpu_tiny.json").read_text())


def test_tiny_cpu_benchmark_writes_consistent_results(tmp_path):
    env = RunEnv(tmp_path)
    out, work = tmp_path / "out", tmp_path / "work"
    _bench(env, out, work, "--runs", "fused,torch,torch_bf16opt")
    r = _bench(env, out, work, "--runs", "peer", "--merge")
    s = r["shape"]
    tokens = s["global_batch"] * s["seq"]
    model = ModelConfig(num_layers=s["layers"], hidden_size=s["hidden"],
                        num_attention_heads=s["heads"], seq_length=s["seq"], vocab_size=s["vocab"])
    flops = model_flops_per_token(model, s["vocab"]) * tokens
    assert r["tokens_per_step"] == tokens
    assert r["model_flops_per_step"] == pytest.approx(flops)
    assert r["layout"] == {"tp": 1, "pp": 1, "dp": 1, "zero": 1, "precision": "bf16",
                           "grad_accum": 2, "recompute": "none"}

    runs = r["runs"]
    assert set(runs) == {"fused", "torch", "torch_bf16opt", "peer"}, \
        "--merge dropped the first invocation's runs"
    assert runs["fused"]["status"] == "skipped" and "GPU" in runs["fused"]["reason"]
    for name in ("torch", "torch_bf16opt", "peer"):
        e = runs[name]
        assert e["status"] == "ok", f"{name}: {e.get('error')}"
        assert len(e["step_times_s"]) == r["warmup_steps"] + r["timed_steps"]
        assert e["steps_timed"] == r["timed_steps"]
        assert e["step_time_s"] > 0
        assert e["tokens_per_s"] == pytest.approx(tokens / e["step_time_s"])
        assert e["tflops_per_gpu"] == pytest.approx(flops / e["step_time_s"] / 1e12)
        assert e["mfu"] == pytest.approx(e["tflops_per_gpu"] / 2.0)
        assert 0 < e["peak_mem_gb"] < 64, f"{name}: peak memory {e['peak_mem_gb']} GiB"
        # A fresh model predicts about uniformly: the first loss is near ln(vocabulary).
        assert abs(e["loss_first"] - math.log(s["vocab"])) < 0.5, f"{name}: {e['loss_first']}"
        assert e["attention"] == "sdpa"
        assert e["precision_policy"]
    # Same shape on both sides, and the planner counts the parameters the trainer built.
    assert runs["torch"]["parameters"] == runs["peer"]["parameters"] == r["planner"]["parameters"]
    # training.grad_accum_dtype=fp32 took DeepSpeed's BF16_Optimizer; the default its ZeRO-1 one.
    assert runs["torch_bf16opt"]["optimizer"] == "BF16_Optimizer", runs["torch_bf16opt"]
    assert runs["torch"]["optimizer"] == "DeepSpeedZeroOptimizer", runs["torch"]

    plan = r["planner"]
    assert plan["layout"] == "tp1-pp1-dp1-mb2-ga2-z1-none-flash"
    assert plan["peak_mem_gb"] > 0 and plan["step_time_s"] > 0 and plan["tokens_per_s"] > 0

    md = (out / "e2e_cpu_tiny.md").read_text()
    for row in ("| this project, torch kernels | sdpa |", "| plain PyTorch peer | sdpa |",
                "| this project, torch kernels, fp32 gradients (BF16_Optimizer) | sdpa |",
                "| planner prediction (probe of this CPU) |", "skipped: the fused kernels"):
        assert row in md, f"{row!r} missing from the markdown table:\n{md}"
    assert not env.log.exists(), f"a compiler ran:\n{env.log.read_text()}"


@pytest.mark.parametrize("script", ["gpu_check.sh", "gpu_prepare.sh"])
def test_gpu_scripts_parse(script):
    proc = subprocess.run(["bash", "-n", f"{ROOT}/benchmarks/{script}"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr


def test_host_benchmark_compares_each_run_with_the_peer_of_its_round(tmp_path):
    env = RunEnv(tmp_path)
    cmd = [sys.executable, f"{ROOT}/benchmarks/e2e/bench_host.py", "--rounds", "1", "--steps",
           "2", "--warmup", "1", "--runs", "torch_bf16opt", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env.env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    rounds = json.loads((tmp_path / "host_overhead_cpu.json").read_text())["rounds_ms"]
    assert len(rounds) == 1 and set(rounds[0]) == {"peer", "torch_bf16opt"}
    assert all(ms > 0 for ms in rounds[0].values())
    md = (tmp_path / "host_overhead_cpu.md").read_text()
    assert "| plain PyTorch peer |" in md and "| 1.00 (1.00-1.00) |" in md
    assert "| this project, torch kernels, fp32 gradients (BF16_Optimizer) |" in md
