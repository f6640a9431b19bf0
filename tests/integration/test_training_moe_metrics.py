"""A MoE run's metrics (docs/moe.md, "Watching it"): a short in-process run writes each MoE
layer's expert load, dropped share and auxiliary losses into its metrics.jsonl step lines and
its log line, and megatron-report lists them in its expert-load table. Dense lines have no
`moe` key (tests/unit/test_base_records.py)."""
import subprocess
import sys

from tests.support.cli import clean_env
from tests.support.paths import ROOT, TINY

SCRIPT = r"""
import logging, sys
from megatron.base.records import read_metrics, steps
from megatron.base.rundir import RunDir
from megatron.config import load_config
from megatron.launch import leave_distributed
from megatron.training.loop import train
from megatron.training.report import write_report

logging.basicConfig(level=logging.INFO)  # the step lines, as megatron-train logs them
cfg = load_config(sys.argv[2], [f"run.dir={sys.argv[1]}", "training.tensorboard=false",
                                "training.train_iters=3", "training.log_interval=1",
                                "model.moe.num_experts=4", "model.moe.capacity_factor=1.0",
                                "model.moe.z_loss_coeff=0.001"])
train(cfg)
lines = steps(read_metrics(RunDir(sys.argv[1]).metrics))
assert [r.step for r in lines] == [1, 2, 3]
for r in lines:
    assert len(r.moe) == cfg.model.num_layers, r.moe
    for layer in r.moe:
        assert set(layer) == {"aux_loss", "z_loss", "tokens_per_expert_max",
                              "tokens_per_expert_mean", "dropped_fraction"}, layer
        assert layer["tokens_per_expert_max"] >= layer["tokens_per_expert_mean"] > 0
        assert 0 <= layer["dropped_fraction"] < 1 and layer["aux_loss"] > 0 < layer["z_loss"]
page = open(write_report([sys.argv[1]], sys.argv[1] + "/report").page).read()
assert "Expert load (MoE)" in page
print("MOE_ROWS", page.split("Expert load (MoE)")[1].count("<tr><td>"))
leave_distributed()
print("OK")
"""


def test_moe_run_logs_expert_load_and_the_report_lists_it(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "run"), TINY], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=clean_env())
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "| moe aux " in out and " load max/mean " in out and " drop " in out, out[-3000:]
    rows = int(out.split("MOE_ROWS ")[1].split()[0])
    assert rows >= 1, out[-2000:]


BIAS = r"""
import os, sys
from megatron.base.records import read_metrics, steps
from megatron.base.rundir import RunDir
from megatron.checkpoint.sharded import Reader, read_meta
from megatron.config import load_config
from megatron.launch import leave_distributed
from megatron.training.loop import train

def run(path, iters, load=None):
    sets = [f"run.dir={path}", "training.tensorboard=false", f"training.train_iters={iters}",
            "model.moe.num_experts=4", "model.moe.router=sigmoid", "model.moe.aux_loss_coeff=0",
            "model.moe.router_bias_update_rate=0.01", "checkpoint.save=true",
            "checkpoint.save_interval=2"] + ([f"checkpoint.load={load}"] if load else [])
    train(load_config(sys.argv[2], sets))

def biases(path, step):
    folder = os.path.join(RunDir(path).checkpoints, f"step_{step:07d}")
    meta, index = read_meta(folder)
    names = sorted(n for n in index if n.endswith("router.expert_bias"))
    return [Reader(folder, index).merged(n, "master").tolist() for n in names]

a, b = sys.argv[1] + "/a", sys.argv[1] + "/b"
run(a, 4)
at2, at4 = biases(a, 2), biases(a, 4)
assert len(at4) == 4 and at2 != at4, (at2, at4)
# each step moves each expert by the rate (or not at all): after 2 steps |b| <= 0.02
assert all(abs(x) <= 0.02 + 1e-6 for layer in at2 for x in layer) and any(x for l in at2 for x in l)
run(b, 4, os.path.join(RunDir(a).checkpoints, "step_0000002"))
assert biases(b, 4) == at4, (biases(b, 4), at4)
la = [r.loss for r in steps(read_metrics(RunDir(a).metrics))][2:]
lb = [r.loss for r in steps(read_metrics(RunDir(b).metrics))]
assert lb == la, (la, lb)
print("BIAS", at4[0])
leave_distributed()
print("OK")
"""


def test_router_bias_moves_each_step_and_resumes_from_a_checkpoint(tmp_path):
    """The loop updates the auxiliary-loss-free bias after each step; a checkpoint keeps it: a
    run resumed at step 2 ends at step 4 with the uninterrupted run's bias and losses."""
    proc = subprocess.run([sys.executable, "-c", BIAS, str(tmp_path), TINY], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=clean_env())
    assert proc.returncode == 0 and "OK" in proc.stdout, (proc.stdout[-2000:]
                                                          + proc.stderr[-3000:])
