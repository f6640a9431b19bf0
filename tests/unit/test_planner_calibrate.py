"""Calibration on synthetic and recorded measurements, trial storage and resumption, and the
Bayesian-optimisation loop with a fake runner. Failures point at calibrate.py, trials.py or
bayes.py; nothing here launches the trainer."""
import dataclasses
import os
import json

import numpy as np
import pytest

from megatron.config import load_config
from megatron.config.errors import InputError
from megatron.planner.calibrate import calibrate, calibration_layouts, nnls, spearman
from megatron.planner.hardware import ClusterSpec
from megatron.planner.layout import Job, Layout
from megatron.planner.memory import peak_memory
from megatron.planner.profile import Constants, Profile, load_profile
from megatron.planner.search import SearchSpace
from megatron.planner.timing import step_time
from megatron.planner.trials import TrialResult, TrialStore, summarize_metrics
from tests.support.paths import ROOT

CPU = ClusterSpec("cpu-test", 8, 0.05, 4, 5, 5, hbm_gbps=5, fp32_tflops=0.05)
TRUTH = Constants(gemm_eff=0.35, gemm_half_dim=32, hbm_eff=0.5, comm_eff=0.3,
                  microbatch_overhead_s=0.02, step_overhead_s=0.15, act_scale=1.3, fixed_gb=0.4)


def cpu_job():
    cfg = load_config("examples/local/tiny.yaml", ["model.hidden_size=128"])
    return Job(cfg.model, 16, "fp32")


class FakeRunner:
    """Measurements from the model under TRUTH constants, with 3% deterministic noise."""

    def __init__(self, job):
        self.job, self.calls = job, []
        self.truth = Profile(CPU, TRUTH)

    def run(self, lay):
        self.calls.append(lay.key())
        t = step_time(self.job, lay, self.truth).step_s
        noise = 1 + 0.03 * np.sin(len(self.calls) * 1.7)
        mem = peak_memory(self.job, lay, TRUTH).peak_gb
        return TrialResult(lay.key(), lay.to_dict(), "ok", step_time_s=t * noise, mem_gb=mem,
                           tokens_per_sec=self.job.global_batch * self.job.seq / t, steps=5)


def test_nnls_and_spearman():
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert np.allclose(nnls(a, np.array([1.0, -1.0, 0.0])), [0.5, 0.0], atol=1e-9)
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 2, 3]) == pytest.approx(1.0)


def test_fit_recovers_the_ranking_and_constants():
    job = cpu_job()
    prior = Profile(CPU, Constants())
    layouts = calibration_layouts(job, prior, SearchSpace(), 12)
    runner = FakeRunner(job)
    trials = [runner.run(lay) for lay in layouts]
    fitted, report = calibrate(job, prior, trials)
    assert report.rel_rmse_after < 0.05 < report.rel_rmse_before
    assert report.spearman >= 0.9
    assert fitted.constants.gemm_eff == pytest.approx(TRUTH.gemm_eff, rel=0.3)
    assert fitted.constants.act_scale == pytest.approx(TRUTH.act_scale, rel=0.05)
    assert fitted.constants.fixed_gb == pytest.approx(TRUTH.fixed_gb, abs=0.05)


def test_profile_round_trips_through_yaml(tmp_path):
    prof = Profile(CPU, TRUTH, {"trials": 3})
    path = tmp_path / "p.yaml"
    prof.save(str(path))
    back = load_profile(str(path))
    assert back.spec == CPU and back.constants == TRUTH and back.fitted == {"trials": 3}


def test_a_profile_fitted_to_the_per_hop_latency_still_loads(tmp_path, caplog):
    path = tmp_path / "old.yaml"
    path.write_text(Profile(CPU, TRUTH).to_yaml().replace("\n  latency_scale: 1.0",
                                                          "\n  comm_latency_s: 2.0e-05"))
    back = load_profile(str(path))
    assert back.constants.latency_scale == 1.0
    assert "comm_latency_s is ignored" in caplog.text and "--fit-only" in caplog.text


def test_a_profile_with_the_per_slot_engine_cost_still_loads_and_says_what_replaced_it(
        tmp_path, caplog):
    path = tmp_path / "old.yaml"
    path.write_text(Profile(CPU, TRUTH).to_yaml().replace("\n  pipe_engine_share: 0.0",
                                                          "\n  pipe_slot_s: 0.018"))
    assert "pipe_slot_s" in path.read_text()
    back = load_profile(str(path))
    assert back.constants.pipe_engine_share == 0.0
    assert "pipe_slot_s is ignored" in caplog.text and "pipe_engine_share" in caplog.text


def test_too_few_trials_is_a_clear_error():
    job = cpu_job()
    with pytest.raises(InputError, match="at least 3 successful trials"):
        calibrate(job, Profile(CPU), [])


def test_store_resumes_and_skips_bad_lines(tmp_path, caplog):
    path = tmp_path / "trials.jsonl"
    store = TrialStore(str(path))
    one, two = (dataclasses.asdict(Layout(t, 1, 2 // t, 1, 4)) for t in (1, 2))
    store.append(TrialResult("a", one, "failed", error="boom"))
    with open(path, "a") as f:
        f.write("{not json\n")
        # a list, a wrong-typed time, a layout that is no object, one with a wrong-typed or
        # missing field: each crashed the fit later (a TypeError or AttributeError traceback)
        f.write("[1, 2]\n")
        f.write(json.dumps({"key": "c", "layout": one, "status": "ok", "step_time_s": "1"}) + "\n")
        f.write(json.dumps({"key": "d", "layout": 5, "status": "ok"}) + "\n")
        f.write(json.dumps({"key": "e", "layout": dict(one, tp="x"), "status": "ok"}) + "\n")
        f.write(json.dumps({"key": "f", "layout": {"tp": 1}, "status": "ok"}) + "\n")
    store.append(TrialResult("a", one, "ok", step_time_s=1.5))
    store.append(TrialResult("b", two, "ok", step_time_s=2.0))
    done = store.load()
    assert set(done) == {"a", "b"} and done["a"].ok and done["a"].step_time_s == 1.5
    assert done["b"].to_layout().tp == 2
    skipped = [r.getMessage() for r in caplog.records if "is not a trial record" in r.message]
    assert [m.split(" is not")[0].rsplit(":", 1)[1] for m in skipped] == \
        ["2", "3", "4", "5", "6", "7"]
    assert "step_time_s is '1'" in skipped[2] and "its layout: tp is 'x'" in skipped[4]


def test_summarize_metrics_skips_warmup_and_eval(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "step_time_s": 9.0, "tokens_per_sec": 1, "mem_gb": 0.5},
            {"step": 2, "step_time_s": 1.0, "tokens_per_sec": 100, "mem_gb": 0.7},
            {"step": 2, "split": "valid", "loss": 3.0},
            {"step": 3, "step_time_s": 1.2, "tokens_per_sec": 90, "mem_gb": 0.6},
            {"step": 4, "step_time_s": 1.1, "tokens_per_sec": 95, "mem_gb": 0.6}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    s = summarize_metrics(str(path), warmup=1)
    assert s["step_time_s"] == pytest.approx(1.0) and s["step_time_median_s"] == pytest.approx(1.1)
    assert s["mem_gb"] == 0.7 and s["steps"] == 4
    no_time = [{k: v for k, v in r.items() if k != "step_time_s"} for r in rows]
    path.write_text("\n".join(json.dumps(r) for r in no_time) + "\n")
    assert summarize_metrics(str(path), 1, tokens_per_step=950)["step_time_s"] == pytest.approx(9.5)


def test_bayes_spends_the_budget_and_resumes(tmp_path):
    pytest.importorskip("optuna", reason="Bayesian optimisation needs the 'plan' extra")
    from megatron.planner.bayes import bayes_search
    job = cpu_job()
    prof = Profile(CPU, Constants())
    store = TrialStore(str(tmp_path / "trials.jsonl"))
    runner = FakeRunner(job)
    first = bayes_search(job, prof, runner, store, budget=5, seed=1)
    assert len(runner.calls) == 5 == len(set(runner.calls)) == len(first)
    again = FakeRunner(job)
    second = bayes_search(job, prof, again, store, budget=3, seed=2)
    assert not set(again.calls) & set(runner.calls)  # stored layouts are not rerun
    assert len(second) == 8
    # the planner's top prediction is among the first layouts tried
    top = calibration_layouts(job, prof, SearchSpace(), 1)[0].key()
    assert top in runner.calls[:3]


def test_recorded_cpu_trials_fit(tmp_path):
    """Trials recorded from real 2-rank CPU runs of the tiny config (tests/support/data, from
    benchmarks/planner_ranking.py): the fit must rank them as they ran."""
    import os
    path = os.path.join(ROOT, "tests", "support", "data", "planner_trials_cpu.jsonl")
    trials = list(TrialStore(path).load().values())
    job = Job(load_config("examples/local/tiny.yaml").model, 16, "fp32")
    spec = dataclasses.replace(CPU, gpus_per_node=2)
    fitted, report = calibrate(job, Profile(spec, Constants()), trials)
    assert report.trials >= 6
    assert report.rel_rmse_after < report.rel_rmse_before
    assert report.spearman >= 0.8


def test_fit_separates_the_link_classes():
    """Two nodes of two ranks: collectives inside a node and across nodes have their own
    factors (comm_eff, inter_comm_eff), and the fit recovers both, not one overall scale."""
    from megatron.planner.search import search
    spec = ClusterSpec("two-nodes", 8, 0.05, 2, 2, 0.5, hbm_gbps=5, fp32_tflops=0.05)
    truth = TRUTH.replace(comm_eff=0.5, inter_comm_eff=0.15)
    job = cpu_job()
    prior = Profile(spec, Constants())
    ranked = [c.layout for c in search(job, 2, prior, SearchSpace()).ranked]
    layouts = ranked[::max(1, len(ranked) // 16)]
    true_prof = Profile(spec, truth)
    trials = [TrialResult(lay.key(), lay.to_dict(), "ok",
                          step_time_s=step_time(job, lay, true_prof).step_s, steps=5)
              for lay in layouts]
    fitted, report = calibrate(job, prior, trials)
    assert report.rel_rmse_after < 0.02
    assert fitted.constants.comm_eff == pytest.approx(0.5, rel=0.25)
    assert fitted.constants.inter_comm_eff == pytest.approx(0.15, rel=0.25)


def test_a_trial_config_runs_flash_layouts_on_the_core_its_device_picks(tmp_path):
    """--flash-backend defaults to auto: the model picks flash where it runs, else sdpa (it was
    "sdpa" written out, on GPUs too); a layout without flash runs the core that keeps the
    scores (variants.attention_core)."""
    from megatron.config import variants
    from megatron.planner.trials import TorchrunRunner
    tiny = f"{ROOT}/examples/local/tiny.yaml"
    job = Job(load_config(tiny).model, 8, "fp32")
    runner = TorchrunRunner(tiny, job, 2, str(tmp_path / "trials"))
    backends = {}
    for flash in (True, False):
        lay = Layout(1, 1, 2, 1, 4, zero=1, flash=flash)
        backends[flash] = load_config(runner.write_config(lay)).model.attention_backend
    assert backends == {True: variants.AUTO, False: "math"}
    assert variants.attention_core(keeps_scores=True).name == "math"
    assert variants.attention_of(job.model, "auto").name == "flash"  # a GPU's pick, priced


def test_a_trial_starts_from_a_run_directory_without_an_earlier_attempts_files(tmp_path):
    """An attempt stopped by Ctrl-C leaves metrics.jsonl and the checkpoint its stop signal
    saved: the rerun of that layout reads no old line, and is not refused as a fresh start below
    a checkpoint of its run.dir (checkpoint/layout.check_continues_newest)."""
    from megatron.base.rundir import RunDir
    from megatron.planner.trials import fresh_trial_dir
    run = RunDir(str(tmp_path / "tp1-pp1"))
    os.makedirs(os.path.join(run.checkpoints, "step_0000003"))
    with open(run.metrics, "w") as f:
        f.write('{"step": 1}\n')
    with open(run.config, "w") as f:
        f.write("kept: the trial rewrites it\n")
    assert fresh_trial_dir(run.path) == run.metrics
    assert not os.path.exists(run.metrics) and not os.path.exists(run.checkpoints)
    assert os.path.exists(run.config)
    never = str(tmp_path / "never-run")
    assert fresh_trial_dir(never) == RunDir(never).metrics


def test_a_trial_times_the_whole_batch_of_a_config_with_a_batch_ramp(tmp_path):
    """A trial of a config with training.rampup_batch_size drops the ramp: its steps would be
    the ramp's first, smaller batches."""
    from megatron.planner.trials import TorchrunRunner
    tiny = f"{ROOT}/examples/local/tiny.yaml"
    job = Job(load_config(tiny).model, 8, "fp32")
    runner = TorchrunRunner(tiny, job, 2, str(tmp_path / "trials"),
                            overrides=["training.global_batch_size=8",
                                       "training.rampup_batch_size=[4, 4, 100]"])
    assert runner.base.training.rampup_batch_size == [4, 4, 100]
    written = load_config(runner.write_config(Layout(1, 1, 2, 1, 4, zero=1))).training
    assert written.rampup_batch_size is None and written.global_batch_size == 8
