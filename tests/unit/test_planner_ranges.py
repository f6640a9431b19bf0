"""The predicted range (megatron/planner/ranges.py): each setting's values against hand-built
variants, the envelope, the setting named as moving it most, the CLI lines, and the measured
coverage of the published cases (benchmarks/results/planner_ranges.json)."""
import dataclasses
import json
import os

import pytest

from megatron.planner import ranges
from megatron.planner.layout import Job, Layout
from megatron.planner.models import preset_model
from megatron.planner.profile import load_profile
from megatron.planner.timing import step_time
from tests.support.paths import ROOT
from tests.support.planner_fits import published_rows

JOB = Job(preset_model("gpt3-1.3b"), 64, "bf16")
LAY = Layout(tp=1, pp=1, dp=8, micro_batch=1, grad_accum=8, zero=1)
PROF = load_profile("h100")


def _step(job, lay, prof):
    return step_time(job, lay, prof).step_s


def test_the_interconnect_swing_is_the_links_at_plus_and_minus_15_percent():
    c = PROF.constants
    slow, fast = (dataclasses.replace(PROF, constants=c.replace(
        comm_eff=c.comm_eff * k, inter_comm_eff=c.inter_comm_eff * k)) for k in (0.85, 1.15))
    rng = ranges.step_range(JOB, LAY, PROF, _step, settings=("interconnect",))
    assert rng.swings["interconnect"] == (_step(JOB, LAY, fast), _step(JOB, LAY, slow))
    assert (rng.low_s, rng.high_s) == rng.swings["interconnect"]
    assert rng.point_s == _step(JOB, LAY, PROF)


def test_the_overlap_swing_runs_from_all_hidden_to_deepspeed_without_overlap_comm():
    hidden = dataclasses.replace(PROF, constants=PROF.constants.replace(dp_overlap=1.0))
    exposed = dataclasses.replace(JOB, deepspeed={"zero_optimization": {"overlap_comm": False}})
    rng = ranges.step_range(JOB, LAY, PROF, _step, settings=("overlap",))
    want = [_step(JOB, LAY, PROF), _step(JOB, LAY, hidden), _step(exposed, LAY, PROF)]
    assert rng.swings["overlap"] == (min(want), max(want))
    assert _step(exposed, LAY, PROF) > _step(JOB, LAY, PROF)


def test_an_engine_with_no_overlap_in_its_code_has_no_overlap_swing():
    """Aleph Alpha's Scaling all-reduces every gradient after the backward, with nothing to
    switch on (Overlap.reduce_fixed): its range does not vary the overlap (it used to span
    down to the reduction all hidden, the widest swing of its searches), and the reduction
    stays priced as exposed; Megatron-LM of 2021, whose runs may have used torch DDP's
    bucketed overlap, keeps the swing."""
    aa = dataclasses.replace(PROF, spec=dataclasses.replace(PROF.spec, framework="aa-scaling"))
    rng = ranges.step_range(JOB, LAY, aa, _step)
    assert "overlap" not in rng.swings and set(rng.swings) == {"interconnect"}
    assert ranges.overlap_variants(JOB, aa) == [(JOB, aa)]
    hidden = dataclasses.replace(aa, constants=aa.constants.replace(dp_overlap=1.0))
    assert _step(JOB, LAY, hidden) < rng.point_s  # what the swing used to reach
    old = dataclasses.replace(PROF, spec=dataclasses.replace(PROF.spec,
                                                             framework="megatron-lm-2021"))
    lo, hi = ranges.step_range(JOB, LAY, old, _step).swings["overlap"]
    assert lo < hi


def test_an_open_micro_batch_spans_those_that_fit_and_the_envelope_holds_every_corner():
    lays = ranges.micro_batch_layouts(JOB, LAY, PROF)
    assert [lay.micro_batch for lay in lays] == [1, 2, 4, 8]
    # 64 / 8 replicas = 8 sequences a replica: 16 does not divide it
    rng = ranges.step_range(JOB, LAY, PROF, _step, free_micro_batch=True)
    times = [_step(JOB, lay, PROF) for lay in lays]
    assert rng.swings["micro_batch"] == (min(times), max(times))
    assert rng.low_s <= min(s[0] for s in rng.swings.values())
    assert rng.high_s >= max(s[1] for s in rng.swings.values())
    assert rng.widest == max(rng.swings, key=lambda k: rng.swings[k][1] - rng.swings[k][0])
    assert "micro_batch" not in ranges.step_range(JOB, LAY, PROF, _step).swings


def test_memory_and_search_print_the_range(capsys):
    from megatron.cli.plan import main
    assert main(["memory", "--model", "gpt3-1.3b", "--cluster", "h100", "--global-batch",
                 "64"]) == 0
    out = capsys.readouterr().out
    assert "predicted step range" in out and "moved most by" in out
    assert f"with the time model's error (+-{100 * ranges.MODEL_ERROR:.1f}%" in out
    assert "micro-batch not given: 1 priced; over those that fit (1, 2, 4, 8)" in out
    lo, hi, mbs = ranges.memory_range(JOB, LAY, PROF)
    assert mbs == [1, 2, 4, 8] and lo < hi
    assert main(["search", "--model", "gpt3-1.3b", "--cluster", "h100", "--global-batch", "64",
                 "--top", "2"]) == 0
    assert "rank 1's step:" in capsys.readouterr().out


def test_the_reported_coverage_is_what_the_published_cases_give():
    """benchmarks/planner_ranges.py's figures, recomputed (about 10 s): the share of published
    steps inside their leave-one-source-out range and the median width."""
    from megatron.planner import range_validation as rv, validation as v
    with open(os.path.join(ROOT, "benchmarks", "results", "planner_ranges.json")) as f:
        recorded = json.load(f)["coverage"]
    cases = v.load_cases()
    cov = rv.coverage(rv.case_ranges(published_rows(), rv.source_bands(cases)))
    assert cov["inside"] == recorded["inside"] and cov["cases"] == recorded["cases"]
    assert cov["inside_band"] == recorded["inside_band"]
    assert cov["median_width"] == pytest.approx(recorded["median_width"], rel=1e-9)
    assert cov["median_band_width"] == pytest.approx(recorded["median_band_width"], rel=1e-9)
    # issue 38: the published figure inside the printed range in at least 80% of cases
    assert cov["band_coverage"] >= ranges.COVERAGE


def test_the_conformal_band_is_the_ceil_n_plus_1_times_coverage_th_smallest_error():
    errors = [0.05, -0.01, 0.2, -0.3, 0.02, 0.07, -0.04, 0.11, 0.09]   # n = 9
    # ceil(10 x 0.8) = 8th smallest |error| of 0.01 0.02 0.04 0.05 0.07 0.09 0.11 0.2 0.3
    assert ranges.conformal_band(errors) == 0.2
    assert ranges.conformal_band(errors, coverage=0.5) == 0.07      # ceil(5) = 5th
    assert ranges.conformal_band(errors[:3]) == float("inf")       # ceil(3.2) = 4 > 3


def test_the_band_widens_the_settings_range_both_ways():
    rng = ranges.step_range(JOB, LAY, PROF, _step, model_error=0.1)
    assert rng.band_low_s == pytest.approx(rng.low_s * 0.9)
    assert rng.band_high_s == pytest.approx(rng.high_s * 1.1)
    assert rng.band_contains(rng.high_s * 1.09) and not rng.contains(rng.high_s * 1.09)
    assert not rng.band_contains(rng.high_s * 1.11)


def test_the_cli_band_is_the_conformal_bound_of_every_held_out_error():
    """ranges.MODEL_ERROR, what `memory` and `search` print, recomputed from published.yaml: the
    bound over every case's error with its own source held out of the fit."""
    from megatron.planner import range_validation as rv, validation as v
    band = ranges.conformal_band(rv.held_out_errors(v.load_cases()))
    assert ranges.MODEL_ERROR == pytest.approx(band, abs=5e-4)


def test_devices_outside_the_validation_say_so_beside_the_band(capsys):
    """memory and search print a note where the published runs behind the band do not cover the
    device (MI300X: its preset's compute rests on five held-out MI325X runs; the one MoE run
    took half as long again as predicted), none on H100."""
    from megatron.cli.plan import main
    assert "50% more" in ranges.device_note("mi300x") and ranges.device_note("h100") == ""
    # the held-out MI250X run (Poro 34B) the frontier preset misses, under either name
    frontier, mi250x = ranges.device_note("frontier"), ranges.device_note("mi250x")
    assert frontier.split(": ", 1)[1] == mi250x.split(": ", 1)[1]
    from megatron.planner import validation
    poro = {c.id: c for c in validation.load_held_out()}["poro-34b-1024"]
    more = poro.published_step_s / validation.preset_step(poro) - 1  # the note's figure, recomputed
    assert more > ranges.MODEL_ERROR and f"{100 * more:.0f}% more" in frontier, more
    argv = ["memory", "--model", "gpt3-1.3b", "--nodes", "1", "--global-batch", "64",
            "--tp", "1", "--micro-batch", "1"]
    assert main(argv + ["--cluster", "mi300x"]) == 0
    assert "note on mi300x: no published run on an MI300-class" in capsys.readouterr().out
    assert main(argv + ["--cluster", "h100"]) == 0
    assert "note on" not in capsys.readouterr().out
    assert main(["search", "--model", "gpt3-1.3b", "--nodes", "1", "--global-batch", "64",
                 "--top", "1", "--cluster", "h200"]) == 0
    assert "note on h200: no published H200 run" in capsys.readouterr().out
    # an engine whose runs the fit never saw (its figures: test_planner_sweep.py)
    assert main(argv + ["--cluster", "h100", "--framework", "aa-scaling"]) == 0
    assert "note on aa-scaling: no run of this engine is in the fit" in capsys.readouterr().out


def test_nemotron4_15b_lies_inside_the_range_its_unstated_overlaps_span():
    """Nemotron-4 15B's pre-training at TP 8 on 768-2304 H100 (published.yaml held_out,
    nemotron24: 0.57-0.64 s a step) is priced with the settings NVIDIA's recipe of the same model
    runs (Megatron Core and its overlaps, micro-batch 4), which its paper does not state: the
    point is 40-58% fast, and each published step lies inside the range `memory` prints,
    whose overlap setting prices the engine without them (megatron-lm) at its slow end."""
    from megatron.planner import validation
    runs = [c for c in validation.load_held_out() if c.source == "nemotron24"]
    assert [c.layout.world for c in runs] == [768, 1536, 2304]
    for case in runs:
        prof = validation.in_sample_profile(case)
        rng = ranges.step_range(case.job, case.layout, prof,
                                _step,
                                model_error=ranges.MODEL_ERROR)
        assert case.published_step_s / rng.point_s - 1 > 0.3, case.id
        assert rng.low_s <= case.published_step_s <= rng.high_s, (case.id, rng)
        slow_end = rng.swings["overlap"][1]
        assert abs(case.published_step_s / slow_end - 1) < 0.15, (case.id, slow_end)


def test_a_layout_of_4096_devices_or_more_names_the_published_runs_that_large(capsys):
    """memory and search print a line on scale for layouts of ranges.SCALE_DEVICES or more: the
    fitted runs that large (Megatron Core's 462B on 6144 H100, Llama 3 on 8192-16,384) within
    3.3% with their source held out, and MegaScale's held-out baseline at 8192 and 12,288 A100
    the 14.5% and 16.2% it states (recomputed here); nothing below that size."""
    from megatron.cli.plan import main
    from megatron.planner import validation
    assert ranges.scale_note(4095) == "" and ranges.scale_note(4096)
    rows = {r.case.id: r for r in published_rows()}
    big = [r for r in rows.values() if r.case.layout.world >= ranges.SCALE_DEVICES]
    assert {r.case.source for r in big} == {"mcore24", "llama3_24"}
    assert max(abs(r.loso_error) for r in big) < 0.033
    held = {c.id: c for c in validation.load_held_out()}
    for case_id in ("megascale-mlm-8192", "megascale-mlm-12288"):
        case = held[case_id]
        step = validation.preset_step(case)
        assert f"{100 * (case.published_step_s / step - 1):.1f}%" in ranges.SCALE_EVIDENCE
    argv = ["memory", "--model", "gpt3-175b", "--cluster", "h100", "--global-batch", "4096",
            "--tp", "8", "--pp", "8", "--micro-batch", "1"]
    assert main(argv + ["--nodes", "512"]) == 0
    assert "note on scale: at 4096 devices or more" in capsys.readouterr().out
    assert main(argv + ["--nodes", "64"]) == 0
    assert "note on scale" not in capsys.readouterr().out


def test_the_band_holds_four_in_five_runs_held_out_of_every_fit():
    """The printed band (the settings' range widened by MODEL_ERROR) aims to hold 80% of runs
    like the published ones; on the runs held out of every fit (published.yaml held_out: 56 from
    8 sources on MI325X, MI250X, H100, H200 and A100) it holds 51 (MLPerf's 27 all; 24 of the
    other 29), those it misses named here: Poro 34B
    (MI250X, 29% fast), MegaScale's baseline at 1024, 8192 and 12,288 A100 (12-16% fast) and
    AMD's Llama 3.1 70B bf16 figure on 64 MI325X (12.5% slow)."""
    from megatron.planner import validation
    outside = []
    runs = validation.load_held_out()
    for case in runs:
        prof = validation.in_sample_profile(case)
        rng = ranges.step_range(case.job, case.layout, prof,
                                _step,
                                model_error=ranges.MODEL_ERROR)
        if not rng.band_low_s <= case.published_step_s <= rng.band_high_s:
            outside.append(case.id)
    assert len(runs) - len(outside) >= ranges.COVERAGE * len(runs), outside
    missed = ["poro-34b-1024", "megascale-mlm-1024", "megascale-mlm-8192", "megascale-mlm-12288",
              "amdperf-llama31-70b-64-bf16"]
    assert sorted(outside) == sorted(missed), outside
