"""The planner against published training runs (megatron/planner/published.yaml).

Leave-one-out: every case is predicted by a fit of the other cases only. A failure of the error
bounds names the case and its source; a failure of an ordering names the publication's
comparison the planner no longer reproduces."""
import dataclasses

import numpy as np
import pytest

from megatron.config.errors import InputError
from megatron.planner import validation as v
from megatron.config.schedules.one_f_one_b import in_flight
from megatron.planner.layout import Layout, layout_ends, layout_problem, layout_stage_layers
from megatron.planner.overlap import DEEPSPEED
from megatron.planner.profile import (CURVE_CONSTANTS, FITTED_PRESETS, FP8_GEMM_FIT,
                                      PRESET_CONSTANTS, PUBLISHED_FIT, apply_fit,
                                      load_profile, preset_fit)
from megatron.planner.timing import pipeline_bubble, step_time
from tests.support.planner_fits import published_rows

@pytest.fixture(scope="module")
def published():
    return v.load_published()


@pytest.fixture(scope="module")
def rows(published):
    assert [c.id for c in published.cases] == [r.case.id for r in published_rows()]
    return list(published_rows())


def _table(rows):
    return "\n".join(f"{r.case.id} ({r.case.source}): published {r.published_tflops:.1f}, "
                     f"held out {r.tflops(r.loo_step_s):.1f} TFLOP/s ({100 * r.loo_error:+.1f}%)"
                     for r in rows)


def test_cases_cover_the_sources_the_issue_names(published):
    sources = {c.source for c in published.cases}
    assert {"narayanan21", "korthikanti22", "mtnlg22", "bloom22", "dash23", "mcore24",
            "mosaic23", "neox22", "lumi23", "llama3_24", "dgxc24"} <= sources
    assert len(sources) >= 10  # issue 38
    assert len(published.cases) >= 69
    assert sum(c.profile.spec.name == "frontier" for c in published.cases) >= 9  # MI250X
    assert {c.profile.spec.name for c in published.cases} >= {"a100", "frontier", "h100"}
    for c in published.cases:
        assert c.published_step_s > 0, c.id


def test_a_case_states_context_parallelism_and_counted_end_stages(published):
    """Llama 3's 128K row as the file gives it: TP 8 x CP 16 (all-gather) x PP 16 x DP 8 on
    16,384 GPUs, 8 one-layer model chunks a stage with the embedding and the head each in a
    layer's place (126 + 2 = 16 x 8: the first chunk the embedding alone, the last the head
    and loss alone, as section 3.3.2 says; the paper's 7, 8, ..., 8, 7 layers a rank), 16
    micro-batches of one 131072-token sequence per replica, gradients reduced in fp32."""
    case = published.by_id()["llama3-405b-128k-16384"]
    lay = case.layout
    assert (lay.tp, lay.cp, lay.pp, lay.dp, lay.world) == (8, 16, 16, 8, 16384)
    assert (lay.cp_algo, lay.interleave, lay.grad_accum) == ("allgather", 8, 16)
    assert (lay.embedding_as_layer, lay.loss_as_layer, lay.first_stage_layers) == \
        (True, True, None)
    assert layout_ends(126, lay) == (0, 0)
    assert layout_stage_layers(126, lay) == [7] + [8] * 14 + [7]
    assert case.job.grad_dtype == "fp32"
    assert (case.framework, lay.zero) == ("fsdp", 2)
    assert layout_problem(case.job, lay, case.framework) is None


def test_published_flops_are_narayanans(published):
    """The sources' FLOP count: meg-1008b at its published 163 TFLOP/s per GPU is the 502
    PFLOP/s aggregate Table 1 reports."""
    case = published.by_id()["meg-1008b"]
    aggregate = v.published_hw_flops(case.job, case.layout) / case.published_step_s
    assert aggregate == pytest.approx(502e15, rel=0.01)


def test_leave_one_out_error_is_within_bounds(rows):
    """Bound 25% until Llama 3's rows took the split the paper states (V = 8, the embedding and
    the head each in a layer's place): 25.5% (llama3-405b-8k-8192), the other 67 within 14%;
    with their data parallelism priced as the paper states it (FSDP keeping the gradients
    sharded: a reduce-scatter every micro-batch) and the fit self-consistent: median 4.4%, max
    14.8% (dgxc-gpt175b-2048)."""
    errors = np.abs([r.loo_error for r in rows])
    assert np.median(errors) <= 0.08, _table(rows)
    worst = max(rows, key=lambda r: abs(r.loo_error))
    assert abs(worst.loo_error) <= 0.20, _table(rows)


def _loso_table(rows):
    return "\n".join(f"{r.case.id} ({r.case.source}): published {r.published_tflops:.1f}, "
                     f"source held out {r.tflops(r.loso_step_s):.1f} TFLOP/s "
                     f"({100 * r.loso_error:+.1f}%)" for r in rows)


def test_leave_one_source_out_error_is_within_bounds(rows):
    """Each case predicted by a fit that saw no case of its paper. Bounds set with 29 cases from
    5 sources (median 6.8%, max 27.6% on MT-NLG); with 48 cases from 8 sources and 4 device
    kinds: median 5.9%, max 15.7% (mpt-1b-h128), so the bounds became issue 26's: median
    <= 10% and every case <= 20%; with 56 cases from 9 sources (LUMI's MI250X runs added):
    median 5.7%, max 12.3% (lumi-175b-16n), held to issue 38's median <= 8%; with 59 cases
    from 10 sources (Llama 3's 405B added): median 5.3%, max 18.6% (llama3-405b-128k-16384);
    with 69 cases from 11 (NVIDIA's DGX Cloud benchmark recipes added): median 5.0%, max
    18.9% (llama3-405b-128k-16384); with Narayanan's Table 1 on the interleaved schedule its
    section 5.1 names and Figure 13 on its own shape: median 5.5%, max 19.2%; with Llama 3's
    rows at 4 model chunks a stage instead of 2 (the paper's text implies 8, which the trainer
    could not express): median 4.9%, max 21.2% (llama3-405b-8k-8192, predicted fast); with
    them at the 8 one-layer chunks the paper states (the embedding and the head each in a
    layer's place: parallel.pipeline_embedding_as_layer / pipeline_loss_as_layer), their
    gradients reduced in fp32 as stated, and Narayanan's Figures 14 and 15 as orderings:
    median 4.7%, max 26.4% (llama3-405b-8k-8192; llama3-405b-8k-16384 26.1%; every other case
    within 13.4%). Those two rows had been priced with Megatron's distributed optimizer (one
    reduce-scatter a step) where the paper states FSDP keeping the gradients sharded (ZeRO-2:
    one every micro-batch, in fp32); so priced (framework fsdp under a pipeline) and with the
    fit made self-consistent (validation.fit_factors), and Llama 3's, MPT's and GPT-NeoX 20B's
    rows without the dropout they did not train with: median 4.6%, max 14.6%
    (dgxc-gpt175b-2048), Llama 3's three rows within 3.4%. Issue 38's bars: median <= 8%,
    every case <= 20%."""
    errors = np.abs([r.loso_error for r in rows])
    assert np.median(errors) <= 0.08, _loso_table(rows)
    assert errors.max() <= 0.20, _loso_table(rows)


def test_leave_one_source_out_fits_see_no_case_of_the_source(published, rows):
    """The factors behind a case's source-held-out prediction are the fit of the other sources'
    cases, and differ from the fit that includes its source."""
    cases = published.cases
    for src in {"narayanan21", "mtnlg22"}:
        row = next(r for r in rows if r.case.source == src)
        others = v.fit_factors([c for c in cases if c.source != src])
        assert np.allclose(row.loso_factors, others)
        assert not np.allclose(row.loso_factors, v.fit_factors(cases))


def test_no_fit_moves_bytes_faster_than_a_links_line_rate(published, rows, monkeypatch):
    """The communication factor multiplies bus time (bytes over nominal x bus_eff): below the
    largest bus_eff of the cases' links some link would beat its line rate. Every fit (all
    cases, each case held out, each source held out) stays at or above it, and the bound binds:
    unbounded, the errors alone take communication just past the NICs' line rate (x0.899; x0.652,
    past NVLink's too, before issue 26 counted two TP collectives in the backward, not four, and
    split pipeline sends over the TP ranks)."""
    comm = list(v.GROUPS).index("comm")
    bound = v.lower_bounds(published.cases)[comm]
    assert bound == pytest.approx(0.9)  # the A100 and H100 nodes' NICs
    fitted = v.fit_factors(published.cases)[comm]
    assert fitted >= bound - 1e-12
    for row in rows:
        assert row.factors[comm] >= bound - 1e-12 and row.loso_factors[comm] >= bound - 1e-12
    spec = published.cases[0].profile.spec  # an A100 node: 300 GB/s NVLink
    assert spec.intra_node_gbps * spec.intra_bus_eff / fitted <= spec.intra_node_gbps
    monkeypatch.setattr(v, "lower_bounds", lambda cases: np.zeros(len(v.PRIOR)))
    assert v.fit_factors(published.cases)[comm] < bound


def test_a_group_no_case_exercises_is_not_fitted(published):
    """Without a DeepSpeed-engine run in the fit, nothing constrains the share the pipeline
    engine adds to a slot: it stays at the prior exactly (0), while the other factors move."""
    megatron_only = [c for c in published.cases if c.framework not in DEEPSPEED]
    fit = v.fit_factors(megatron_only)
    assert fit[list(v.GROUPS).index("pipe_engine")] == 0.0
    assert not np.allclose(fit[:3], v.PRIOR[:3])
    assert v.constrained_by(megatron_only)["pipe_engine"] == ()
    assert set(v.constrained_by(published.cases)["pipe_engine"]) == \
        {"mtnlg22", "bloom22", "dash23", "neox22", "lumi23"}


def test_fit_improves_on_the_prior(rows):
    s = v.summary(rows)
    assert s["loo_median"] < s["prior_median"]


def test_no_fit_sees_its_held_out_case(published):
    """The held-out prediction changes when the case is added to the fit (it was not in it)."""
    cases = published.cases
    held = cases[-1]
    without = v.predict(held, v.fit_factors(cases[:-1]))
    with_it = v.predict(held, v.fit_factors(cases))
    assert without != pytest.approx(with_it, rel=1e-9)


def test_leave_one_out_starts_from_the_curves_not_the_presets(published):
    """The presets carry the fit of all cases, the held-out case included; leave-one-out must
    start from the curves alone (or each case would leak into its own prediction)."""
    case = published.by_id()["meg-18.4b"]
    assert case.profile.constants == CURVE_CONSTANTS["a100"]
    assert case.profile.constants != PRESET_CONSTANTS["a100"]


def test_the_fit_is_self_consistent_and_prices_what_the_presets_price(published):
    """validation.fit_factors settles where its own solve, with every case's seconds taken at
    the fit, returns the fit; and a case predicted with the fit is what `megatron-plan
    --cluster PRESET` prints for it (in_sample_profile: the presets carry the rounded fit),
    so a held-out figure is the time model's own, not a linearisation of it at the prior."""
    fit = v.fit_factors(published.cases)
    assert np.max(np.abs(v._solve(published.cases, fit) - fit)) < 1e-4
    rounded = np.array([PUBLISHED_FIT[name] for name in v.GROUPS])
    checked = 0
    for case in published.cases:
        if case.profile.spec.name not in FITTED_PRESETS:
            continue   # frontier: the preset keeps its paper calibration, not the fit
        assert v.predict(case, rounded) == pytest.approx(v.preset_step(case), rel=1e-9), \
            case.id
        checked += 1
    assert checked >= 60


def test_presets_carry_the_fit_of_all_cases(published):
    """profile.PUBLISHED_FIT is what validation.py fits on every case (stored rounded), and
    the GPU presets are the curves with it folded in (MI300X with its own compute factor,
    profile.DEVICE_FIT); Frontier keeps its paper calibration."""
    fit = v.published_fit(published.cases)
    assert set(fit) == set(PUBLISHED_FIT)
    for name, value in fit.items():
        assert PUBLISHED_FIT[name] == pytest.approx(value, rel=1e-3), (name, value)
    for name in FITTED_PRESETS:
        # and the FP8 twins' fit (tests/unit/test_planner_fp8.py checks that one)
        assert load_profile(name).constants == apply_fit(
            CURVE_CONSTANTS[name], preset_fit(name)).replace(fp8_gemm_eff=FP8_GEMM_FIT)
    # one chip keeps its own compute factor (its own runs, held out of the fit: test_planner_fp8)
    assert {n: preset_fit(n) for n in FITTED_PRESETS if preset_fit(n) != PUBLISHED_FIT} == {
        n: {**PUBLISHED_FIT, "compute": 1.0} for n in ("mi300x", "mi325x")}
    assert load_profile("frontier").constants == CURVE_CONSTANTS["frontier"]


def test_presets_predict_every_published_case_in_sample(published):
    """In sample (each case was part of the presets' fit): what `megatron-plan --cluster
    PRESET` predicts for each published layout, the runs not on DeepSpeed's pipeline engine
    without its share of each slot, is within 20% of what was published (Llama 3's two 8K
    rows were 26% until their data parallelism was priced as stated); median within 6%."""
    errors = {}
    for case in published.cases:
        errors[case.id] = case.published_step_s / v.preset_step(case) - 1
    assert max(abs(e) for e in errors.values()) <= 0.20, errors
    assert np.median(np.abs(list(errors.values()))) <= 0.06, errors


def test_published_layouts_rank_near_the_predicted_best(published):
    """Layouts the publications chose for speed, searched among every fitting layout with the
    same micro-batch, ZeRO, recompute, attention path and SP (docs/planner.md, "Ranking"):
    each fits but two of Llama 3's, which the memory model prices above the 80 GB they trained
    on (82.3 and 87.9 GiB reserved), and those that fit are within 25% of the predicted best,
    the median within 5%."""
    ranks = [v.rank_published_layout(c) for c in published.cases
             if c.source in v.CHOSEN_FOR_SPEED]
    table = "\n".join(f"{r.case.id}: rank {r.rank}/{r.fitting}, best {r.best.key()}, "
                      f"{100 * (r.behind or 0):.1f}% behind" for r in ranks)
    unfit = [r.case.id for r in ranks if r.rank is None]
    assert unfit == ["llama3-405b-8k-8192", "llama3-405b-128k-16384"], table
    fit = [r.behind for r in ranks if r.rank is not None]
    assert max(fit) <= 0.25, table
    assert np.median(fit) <= 0.05, table


def test_three_in_four_layouts_chosen_for_speed_rank_in_the_top_3(published):
    """Published layouts chosen for speed rank within the planner's top 3 in at least 75% of
    the fitted cases (benchmarks/results/planner_rank_sensitivity.md, "as shipped"): 25 of 33.
    Issue 26's bar was 80% of the 30 it counted (24 of 30); Llama 3's three, counted since
    the search expresses their end stages, add one in the top 3 and two priced not to fit.
    Issue 38's 85% is not met (docs/planner.md, "Ranking")."""
    ranks = [v.rank_published_layout(c) for c in published.cases
             if c.source in v.CHOSEN_FOR_SPEED]
    outside = [f"{r.case.id} {r.rank}/{r.fitting}" for r in ranks if (r.rank or 99) > 3]
    assert (len(ranks), len(ranks) - len(outside)) == (33, 25), outside


def test_layouts_chosen_for_speed_held_out_of_every_fit_as_stated(published):
    """docs/planner.md, "Ranking": beside the 33 fitted layouts, 34 held out of every fit are
    ranked: GLM-130B's two (9th of 39) and the measured best of each sweep that searched for
    the fastest layout (sweeps.CHOSEN_BY_SWEEP). Hagemann et al.'s 10: all in the top 3 (6
    first; 5 before the engine's eager loss and spent buffer slots were priced, 4 before its
    gathered SP inputs and whole-vocabulary logits); priced as megatron-deepspeed 6 would be,
    as megatron-lm-2021 4 (the count rests on the engine, as the page says). The Ultra-Scale
    Playbook's 22 (nanotron): 20 in the top 3, 14 first (80B on 128 and 256 H100 4th of 5
    and 7th of 10); priced as megatron-lm, whose even split gives the output layer's stage 8
    layers and the output layer, 17. MLPerf Training's 27 submissions on H100 and H200
    (mlperf): 23 in the top 3, 16 first; outside, 1.5-2.7% behind the predicted best, four of
    NVIDIA's FP8 GPT-3 175B at TP 4 x PP 8 (v4.0 on 512 GPUs 4th of 12, v4.1 on 256 4th of 14,
    on 1536 and 3072 6th of 34). Together 78 of 94 (83%); 55 of 67 (82%) without MLPerf's."""
    from megatron.planner import sweeps
    glm = [v.rank_published_layout(c) for c in published.held_out if c.source == "glm22"]
    bests = {src: [sweeps.measured_best(s) for s in sweeps.load_sweeps() if s.source == src]
             for src in sweeps.CHOSEN_BY_SWEEP}
    best = {src: [v.rank_published_layout(c) for c in cases] for src, cases in bests.items()}
    assert [r.rank for r in glm] == [9, 9] and len(best["hagemann23"]) == 10
    assert all(r.rank <= 3 for r in best["hagemann23"])
    assert sum(r.rank == 1 for r in best["hagemann23"]) == 6
    for engine, top3 in (("megatron-deepspeed", 6), ("megatron-lm-2021", 4)):
        ranks = [v.rank_published_layout(sweeps.reframed(c, engine)).rank
                 for c in bests["hagemann23"]]
        assert sum(r is not None and r <= 3 for r in ranks) == top3, (engine, ranks)
    usp = best["usp25"]
    outside = sorted(f"{r.case.id} {r.rank}/{r.fitting}" for r in usp if (r.rank or 99) > 3)
    assert (len(usp), sum(r.rank == 1 for r in usp)) == (22, 14)
    assert outside == ["usp25-80b-128-tp4-pp32-mb1-sp-z0 4/5",
                       "usp25-80b-256-tp4-pp16-mb1-sp-z1 7/10"]
    ranks = [v.rank_published_layout(sweeps.reframed(c, "megatron-lm")).rank
             for c in bests["usp25"]]
    assert sum(r is not None and r <= 3 for r in ranks) == 17
    mlperf = [v.rank_published_layout(c) for c in published.held_out if c.source == "mlperf"]
    outside = sorted(f"{r.case.id} {r.rank}/{r.fitting}" for r in mlperf if (r.rank or 99) > 3)
    assert (len(mlperf), sum(r.rank == 1 for r in mlperf)) == (27, 16)
    assert outside == ["mlperf-gpt3-v40-512 4/12", "mlperf-gpt3-v41-1536 6/34",
                       "mlperf-gpt3-v41-256 4/14", "mlperf-gpt3-v41-3072 6/34"]
    assert max(r.behind for r in mlperf) < 0.03
    fitted = [v.rank_published_layout(c) for c in published.cases
              if c.source in v.CHOSEN_FOR_SPEED]
    counted = fitted + glm + best["hagemann23"] + usp
    assert (len(counted), sum((r.rank or 99) <= 3 for r in counted)) == (67, 55)
    counted += mlperf
    assert (len(counted), sum((r.rank or 99) <= 3 for r in counted)) == (94, 78)


def test_a_published_layout_that_fits_is_found_by_its_own_search(published):
    """Every published case whose layout fits its device is among the layouts its ranking
    searches: context parallelism and model chunks are searched at the published degree beside
    none, so a layout with them (NVIDIA's recipes: CP 2 ring, 5-12 virtual stages) is ranked,
    not reported as not fitting. A layout over the device memory is reported as such. So are
    set first/last stage counts (GLM-130B's 8, 9 x 6, 8, held out) and the layouts compared
    without a figure, TP past a node among them (Narayanan's TP 16 and 32)."""
    from megatron.planner.memory import GIB, peak_memory
    checked = 0
    for case in published.cases + published.held_out + published.layouts:
        prof = v.in_sample_profile(case)
        mem = peak_memory(case.job, case.layout, prof.constants, framework=prof.spec.framework)
        fits = mem.reserved_bytes <= prof.spec.gpu_memory_gb * GIB
        rank = v.rank_published_layout(case, prof)
        assert (rank.rank is not None) == fits, (case.id, rank.rank, mem.reserved_bytes / GIB)
        checked += fits and (case.layout.cp > 1 or case.layout.interleave > 1)
    assert checked >= 6  # dgxc24's CP and virtual-stage layouts that fit


def test_frontier_prior_is_not_the_fitted_preset(published):
    """The frontier preset's efficiencies were set from the 175B case; validation must not use
    them, or that case would predict itself."""
    case = published.by_id()["frontier-175b"]
    assert case.profile.constants == v.VALIDATION_PRIOR["frontier"]


def test_published_lighter_ends_offer_a_layouts_set_end_counts():
    """A layout's set first/last model-chunk counts become the search's lighter_ends: how many
    layers fewer than a middle chunk each end holds, beside 0 (by hand: 70 layers as 8, 9 x 6,
    8 on 8 stages: 1; 126 as 7, 8 x 14, 7: 1; 60 as 6, 8 x 6, 6 on 8 stages: 2; one end set, 3
    of 36 on 4 stages with 11 each between: 8). A split the middle chunks cannot share evenly
    is one clear error."""
    def ends(layers, pp, first, last, chunks=1):
        lay = Layout(1, pp, 1, 1, 1, interleave=chunks, first_stage_layers=first,
                     last_stage_layers=last)
        return v.published_lighter_ends(layers, lay)
    assert ends(70, 8, 8, 8) == (0, 1)
    assert ends(126, 16, 7, 7) == (0, 1)
    assert ends(60, 8, 6, 6) == (0, 2)
    assert ends(36, 4, 3, None) == (0, 8)
    assert ends(126, 8, 3, 3, chunks=4) == (0, 1)  # Llama 3's 3 + 30 x 4 + 3 as 4 chunks a stage
    with pytest.raises(InputError, match="not an even split"):
        ends(70, 8, 8, 7)


def test_ends_counted_as_a_layer_rank_as_the_split_the_search_writes(published):
    """The embedding and loss counted as a layer where each end chunk keeps a layer split the
    layers as set first/last counts do, which is how the search lists that split: the published
    layout is ranked in that form, not reported as not fitting (MLPerf's Llama 3.1 405B at TP 8
    x PP 8 x 8 chunks x CP 2 on 512 H100: 126 + 2 over 64 chunks, 2 a chunk, the end chunks 1
    layer each: first1-last1). Where a counted end empties its chunk (Llama 3's PP 16 x 8:
    128 chunks) the counted form is the search's own and stays."""
    case = {c.id: c for c in published.held_out}["mlperf-llama405b-v50-512"]
    lay = case.layout
    assert (lay.pp, lay.interleave, lay.embedding_as_layer, lay.loss_as_layer) == (8, 8, 1, 1)
    form = v.searched_form(126, lay)
    assert (form.first_stage_layers, form.last_stage_layers, form.counted) == (1, 1, 0)
    assert form.key().endswith("-v8-cp2-first1-last1-ring") and lay.key() != form.key()
    rank = v.rank_published_layout(case)
    assert rank.rank == 1 and rank.fitting > 1, rank
    ranked_as_written = v.rank_published_layout(dataclasses.replace(case, layout=form))
    assert (ranked_as_written.rank, ranked_as_written.fitting) == (rank.rank, rank.fitting)
    llama3 = published.by_id()["llama3-405b-8k-16384"].layout
    assert v.searched_form(126, llama3) == llama3


def test_glm_130b_is_priced_within_the_band_and_its_search_finds_it(published):
    """GLM-130B's speed test (glm22, held out of every fit: 88.5 s at batch 4224 and 122.5 s
    at 6144 on 768 A100 40 GB, TP 4 x PP 8 with the end stages a layer lighter, ZeRO-1 under
    DeepSpeed's pipeline engine): each step within the time model's error band, each fitting
    40 GiB as it ran, its layout found among its settings' (the search's lighter_ends), and the
    source's own trade holding (TP 4 ahead of TP 2 and TP 8 at a model-parallel size of 32,
    test_published_orderings_hold). Its rank is reported, not held: the planner puts TP 2 x PP
    12 ahead of it (docs/planner.md, "Ranking")."""
    from megatron.planner import ranges
    from megatron.planner.memory import GIB, peak_memory
    runs = [c for c in published.held_out if c.source == "glm22"]
    assert [c.job.global_batch for c in runs] == [4224, 6144]
    for case in runs:
        prof = v.in_sample_profile(case)
        error = case.published_step_s / step_time(case.job, case.layout, prof).step_s - 1
        assert abs(error) < ranges.MODEL_ERROR, (case.id, error)
        mem = peak_memory(case.job, case.layout, prof.constants, framework=prof.spec.framework)
        assert mem.reserved_bytes <= 40 * GIB, case.id
        rank = v.rank_published_layout(case, prof)
        assert rank.rank is not None and rank.fitting > 10, rank
    assert any(c.source == "glm22" and not c.known_failure for c in published.comparisons)


@pytest.mark.parametrize("factors", ["prior", "fitted"])
def test_published_orderings_hold(published, factors):
    f = None if factors == "prior" else v.fit_factors(published.cases)
    cases = published.by_id()
    failed, fixed = [], []
    for comp in published.comparisons:
        ok, rates = v.ordering_holds(comp, cases, f)
        if not ok and not comp.known_failure:
            failed.append(f"{comp.source}: {comp.what}: {dict(zip(comp.order, rates))}")
        # known_failure records what the shipped (fitted) model gets wrong; the prior may get
        # it right (Figure 13 at batch 32 holds there, a tie with the fit)
        if ok and comp.known_failure and factors == "fitted":
            fixed.append(f"{comp.what} now holds: drop known_failure in published.yaml")
    assert not failed, "\n".join(failed)
    assert not fixed, "\n".join(fixed)


def test_known_failures_are_few(published):
    """The orderings the planner does not reproduce stay an exception (docs/planner.md): none
    since the fit became self-consistent (Figure 13 at batch 32, a tie, failed by 0.10%
    before)."""
    known = [c for c in published.comparisons if c.known_failure]
    assert not known and len(published.comparisons) >= 18


def test_selective_recompute_gain_is_near_korthikanti(published):
    """Table 5: selective recompute + SP is 29-32% faster than full recompute."""
    cases = published.by_id()
    for size in ("22b", "175b", "530b", "1t"):
        gain = v.predict(cases[f"sel-{size}-full"]) / v.predict(cases[f"sel-{size}-sel"]) - 1
        assert 0.2 <= gain <= 0.45, (size, gain)


def test_interleaving_gain_shrinks_with_batch(published):
    """Narayanan et al. Figure 12: the interleaved schedule's advantage narrows as the batch
    (the number of micro-batches) grows."""
    c = published.by_id()
    gain = {b: v.predict(c[f"il-175b-b{b}-1f1b"]) / v.predict(c[f"il-175b-b{b}-v2"]) - 1
            for b in (12, 60)}
    assert gain[12] > gain[60] > 0


# primus25 (published.yaml): tokens/s per device on 8 MI300X, Llama 2 7B at PP 8
PRIMUS_1F1B = 10057
PRIMUS_GAINS = {"primus-7b-v2": 10974 / PRIMUS_1F1B, "primus-7b-zbv": 11347 / PRIMUS_1F1B}


def _gain(c, case_id, m, factors):
    """Step time of 1F1B over the case's, both at m micro-batches of one sequence."""
    def at(case):
        job = dataclasses.replace(case.job, global_batch=m)
        return v.predict(dataclasses.replace(case, job=job,
                                             layout=dataclasses.replace(case.layout,
                                                                        grad_accum=m)), factors)
    return at(c["primus-7b-1f1b"]) / at(c[case_id])


def test_mi300x_schedule_gains_lie_in_the_range_over_the_unstated_batch(published):
    """The source leaves the batch open. Over 8-128 micro-batches the planner's gains of
    interleaving and of ZB-V over 1F1B span ranges that hold the published ones, ZB-V ahead of
    interleaving at every count; at the assumed 32 both are within 3% (docs/planner.md)."""
    c, fit = published.by_id(), v.fit_factors(published.cases)
    counts = (8, 16, 32, 64, 128)
    gains = {i: [_gain(c, i, m, fit) for m in counts] for i in PRIMUS_GAINS}
    for case_id, measured in PRIMUS_GAINS.items():
        assert min(gains[case_id]) < measured < max(gains[case_id]), (case_id, gains[case_id])
        assert _gain(c, case_id, 32, fit) == pytest.approx(measured, rel=0.03), case_id
    assert all(z > i > 1 for z, i in zip(gains["primus-7b-zbv"], gains["primus-7b-v2"])), gains


def test_interleaved_bubble_and_memory():
    """(p - 1)/(v m + p - 1) idle; the first stage holds p + (p - 1)/v micro-batches' worth
    of activations (Korthikanti et al. section 4.2.3), more than 1F1B's p."""
    plain = Layout(8, 12, 1, 1, 24)
    inter = Layout(8, 12, 1, 1, 24, interleave=2)
    assert pipeline_bubble(plain) == pytest.approx(11 / 35)
    assert pipeline_bubble(inter) == pytest.approx(11 / 59)
    assert in_flight(plain.pipe, 0) == 12
    assert in_flight(inter.pipe, 0) == pytest.approx(12 + 11 / 2)
    assert in_flight(inter.pipe, 11) == pytest.approx(13 / 2)  # (v - 1) p + 1 chunks


def test_interleaving_needs_megatrons_divisibility(published):
    """The planner applies the trainer's rules (config/interleaving.py), with its messages."""
    job = published.by_id()["il-175b-b12-v2"].job
    assert layout_problem(job, Layout(8, 12, 1, 1, 12, interleave=2)) is None
    assert "a multiple of pipeline_parallel_size x virtual_pipeline_size = 12 x 3" in \
        layout_problem(job, Layout(8, 12, 1, 1, 12, interleave=3))
    small = dataclasses.replace(job, global_batch=6)
    assert "6 / (1 x 1) = 6, a multiple of parallel.pipeline_parallel_size=12 under " \
        "interleaving" in layout_problem(small, Layout(8, 12, 1, 1, 6, interleave=2))
    assert "PP > 1" in layout_problem(job, Layout(8, 1, 12, 1, 1, interleave=2))


def test_zbv_takes_any_micro_batch_count_as_the_trainer_does(published):
    """ZB-V's order takes any number of micro-batches (config/interleaving.micro_batch_rule);
    before, the planner restated the interleaved rule for every schedule with chunks and
    refused ZB-V layouts the trainer runs. Its own rule, two chunks exactly, still holds."""
    job = dataclasses.replace(published.by_id()["il-175b-b12-v2"].job, global_batch=6)
    assert layout_problem(job, Layout(8, 12, 1, 1, 6, interleave=2, schedule="zbv")) is None
    assert "virtual_pipeline_size" in layout_problem(
        job, Layout(8, 12, 1, 1, 6, interleave=4, schedule="zbv"))


def test_step_time_reports_the_interleaved_bubble(published):
    case = published.by_id()["il-175b-b12-v2"]
    t = step_time(case.job, case.layout, case.profile)
    assert t.bubble == pytest.approx(pipeline_bubble(case.layout))


def test_megascale_baseline_is_priced_within_a_fifth_and_drifts_fast_with_scale(published):
    """MegaScale's Megatron-LM baseline (megascale24, held out: 175B at TP 8 x PP 8 with 6
    chunks a stage on 256-12,288 A100) is priced within 20% at every device count, and at each
    of its two batches the largest run is priced faster, relative to its published step, than
    the smallest: the per-GPU decline at scale that the planner under-prices (docs/planner.md,
    "Ranges": stragglers and late reduce-scatters at that scale, not modelled)."""
    runs = [c for c in published.held_out if c.source == "megascale24"]
    assert len(runs) == 9

    def error(case):
        return case.published_step_s / v.preset_step(case) - 1
    errors = {c.id: error(c) for c in runs}
    assert max(abs(e) for e in errors.values()) < 0.20, errors
    for small, large in (("megascale-mlm-256", "megascale-mlm-1024"),
                         ("megascale-mlm-3072", "megascale-mlm-12288")):
        assert errors[large] > errors[small] + 0.05, errors


def _zb_gains(published):
    """zb24's schedules, each against 1F1B at the same model and micro-batch count: (published
    gain, the shipped presets' gain) in tokens/s per device."""
    by_id = published.by_id()
    out = {}
    for comp in (c for c in published.comparisons if c.source == "zb24"):
        base = by_id[comp.order[-1]]
        base_s = v.preset_step(base)
        for faster in comp.order[:-1]:
            case = by_id[faster]
            out[faster] = (base.published_step_s / case.published_step_s - 1,
                           base_s / v.preset_step(case) - 1)
    return out


def test_zero_bubble_gains_over_1f1b_are_the_published_ones_within_5_points(published):
    """Qi et al.'s Zero Bubble measurements on 8-32 A100 (zb24: ZB-1p, held to 1F1B's memory and
    at ZB-H1's bubble, 4.2-15% over 1F1B; ZB-V 9.7-23%), never fitted: the planner's zbh1 and
    zbv gains over 1F1B at the same micro-batch count are each within 5 points of the
    published gain, their median within 2, and every published order holds
    (test_published_orderings_hold)."""
    gains = _zb_gains(published)
    assert len(gains) == 30  # 12 ZB-1p runs of Table 4, 9 ZB-1p and 9 ZB-V of Table 6
    misses = {k: round(100 * (pred - pub), 1) for k, (pub, pred) in gains.items()}
    assert max(abs(x) for x in misses.values()) < 5, misses
    assert np.median([abs(x) for x in misses.values()]) < 2, misses
