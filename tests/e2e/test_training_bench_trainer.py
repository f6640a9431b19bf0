"""The trainer overhead benchmark (benchmarks/trainer/bench_trainer.py) in its tiny mode: the
trainer and both peers train, the layouts and start-up sections run, and the JSON and markdown
carry the fields the committed results are read from, with values that follow from each other.
No timing bound: the benchmark reports ratios; this checks only that it can. About 25 s."""
import json
import subprocess
import sys

import pytest

from tests.e2e.e2e_helpers import ROOT, RunEnv

BENCH = f"{ROOT}/benchmarks/trainer/bench_trainer.py"


def test_tiny_benchmark_reports_ratios_efficiency_and_startup(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, BENCH, "--tiny", "--out", str(out), "--layouts", "dp2",
                           "--startup-ranks", "1"], cwd=ROOT, env=RunEnv(tmp_path).env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((out / "trainer_overhead.json").read_text())
    assert r["tiny"] and r["machine"]["threads_per_process"] == 1

    single = r["single"]
    (round_,) = single["rounds"]
    assert sorted(round_["order"]) == ["hf", "megatron", "plain"]
    for program in ("megatron", "plain", "hf"):
        entry = round_[program]
        assert len(entry["iteration_times_s"]) == single["warmup_steps"] + single["timed_steps"]
        assert entry["tokens_per_s"] == pytest.approx(
            single["tokens_per_step"] / entry["median_iteration_s"])
        assert 0 < entry["launch_to_first_step_s"] < 300
    for peer in ("plain", "hf", "faster_peer"):
        for clock in ("wall", "cpu"):
            ratio = single["ratios"][peer][clock]
            assert ratio["n"] == 1 and ratio["min"] <= ratio["median"] <= ratio["max"]
            assert ratio["best_rounds"] == pytest.approx(ratio["median"])  # one round
    faster = max(round_["plain"]["tokens_per_s"], round_["hf"]["tokens_per_s"])
    assert single["ratios"]["faster_peer"]["wall"]["median"] == pytest.approx(
        round_["megatron"]["tokens_per_s"] / faster)

    layouts = r["layouts"]
    assert layouts["layouts"]["dp2"]["world"] == 2 and layouts["layouts"]["single"]["world"] == 1
    (lr,) = layouts["rounds"]
    assert layouts["efficiency"]["dp2"]["median"] == pytest.approx(
        lr["dp2"]["tokens_per_s"] / (2 * lr["single"]["tokens_per_s"]))

    case = r["startup"]["cases"]["1"]
    assert {"imports", "deepspeed import", "model build", "optimizer",
            "deepspeed initialize"} <= set(case["phases"])
    assert 0 < case["rank0_process_to_first_step_s"]["median"] < 300

    md = (out / "trainer_overhead_tables.md").read_text()
    for heading in ("## One process", "## Layouts", "## Start-up"):
        assert heading in md
