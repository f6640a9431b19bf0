"""megatron-train reports its start-up by phase: one log line and a "startup" record in the first
metrics line whose phases add up to the time from the process's launch to the first step; and a
ZeRO run does not load torch._inductor.compile_fx (DeepSpeed's Muon import, which the engine
stands in for)."""
import json
import subprocess
import sys

from tests.e2e.e2e_helpers import ROOT, TINY, RunEnv

SCRIPT = """
import sys
from megatron.cli.train import main
code = main(sys.argv[1:])
print("INDUCTOR", "torch._inductor.compile_fx" in sys.modules)
sys.exit(code)
"""


def test_first_metrics_line_and_log_hold_the_startup_phases(tmp_path):
    run_dir = tmp_path / "run"
    env = RunEnv(tmp_path)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, "--config", TINY,
                           "--set", "training.train_iters=2", "--set", "parallel.zero_stage=1",
                           "--set", "training.tensorboard=false", "--set", f"run.dir={run_dir}"],
                          cwd=ROOT, env=env.env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "INDUCTOR False" in proc.stdout, \
        "a ZeRO-1 run loaded torch._inductor.compile_fx (DeepSpeed's Muon)"
    assert "start-up: " in proc.stderr and "from launch to the first step" in proc.stderr
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    startup = lines[0]["startup"]
    assert "startup" not in lines[1]
    phases = startup["phases"]
    for name in ("python and CLI", "imports", "process group", "deepspeed import", "model build",
                 "optimizer", "deepspeed initialize", "data"):
        assert name in phases, name
    assert abs(sum(phases.values()) - startup["total_s"]) < 0.02
    assert 0 < startup["total_s"] < 300 and startup["first_step_s"] > 0
