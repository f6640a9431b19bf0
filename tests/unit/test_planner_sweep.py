"""Published layout sweeps (planner/sweeps.py, published.yaml `sweeps`): the order statistics
against hand calculations, the loader's refusals, and the BigScience and Hagemann et al.
sweeps' figures guarded in bands, so that a change to the planner that moves them is seen and
docs/planner.md ("Layout sweeps") restated. The sweeps are held out of every fit: nothing here
fits to them."""
import functools

import pytest

from megatron.config.errors import InputError
from megatron.planner import ranges, sweeps, validation
from megatron.planner.memory import peak_memory
from megatron.planner.sweeps import build_sweep, pairs_agreeing, ranks, spearman


def test_ranks_share_ties_and_start_at_one():
    assert list(ranks([30.0, 10.0, 20.0])) == [3.0, 1.0, 2.0]
    assert list(ranks([5.0, 1.0, 5.0, 2.0])) == [3.5, 1.0, 3.5, 2.0]


def test_spearman_by_hand():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # d = (0, 0, 1, -1): 1 - 6 * 2 / (4 * 15) = 0.8
    assert spearman([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(0.8)
    assert spearman([1, 1, 1], [1, 2, 3]) == 0.0   # no spread: no correlation claimed


def test_pairs_within_the_noise_are_not_counted():
    measured = [100.0, 102.0, 120.0]
    # (100, 102) is 2% apart: left out at 3%; (100, 120) and (102, 120) counted
    assert pairs_agreeing(measured, [1.0, 2.0, 3.0], 0.03) == (2, 2)
    assert pairs_agreeing(measured, [3.0, 2.0, 1.0], 0.03) == (0, 2)
    assert pairs_agreeing(measured, [3.0, 2.0, 1.0], 0.01) == (0, 3)


RAW = {"name": "t", "source": "test", "what": "w", "min_gap": 0.03,
       "common": {"layers": 4, "hidden": 256, "heads": 4, "gpus": 8},
       "rows": [{"tp": 2, "pp": 1, "micro_batch": 1, "batch": 8, "step_s": 1.0}]}


def _defaults():
    return validation.load_published().defaults


def test_build_sweep_makes_one_case_per_row():
    sweep = build_sweep(RAW, _defaults())
    (row,) = sweep.rows
    assert row.case.layout.world == 8 and row.case.layout.dp == 4
    assert row.case.published_step_s == 1.0 and not row.oom and row.mem_gb is None
    assert row.case.id == "t-tp2-pp1-mb1" and row.case.source == "test"


@pytest.mark.parametrize("row, words", [
    ({"tp": 2, "pp": 1, "micro_batch": 1, "batch": 8, "step_s": 1.0, "memory": 3},
     "unknown field 'memory'"),
    ({"tp": 2, "pp": 1, "micro_batch": 1, "batch": 8}, "give step_s"),
    ({"tp": 2, "pp": 1, "micro_batch": 1, "batch": 8, "step_s": 1.0, "oom": True},
     "give step_s"),
    ({"tp": 2, "pp": 1, "micro_batch": 1, "batch": 8, "step_s": 1.1}, "is row 0 already"),
    ({"tp": 2, "pp": 1, "micro_batch": 1, "batch": 8, "step_s": 1.1, "sp": False},
     "is row 0 already"),
])
def test_build_sweep_refuses_a_bad_row_by_its_index(row, words):
    with pytest.raises(InputError, match=words) as err:
        build_sweep({**RAW, "rows": [RAW["rows"][0], row]}, _defaults())
    assert "sweep t row 1" in str(err.value)


def test_a_row_with_sequence_parallelism_is_a_layout_of_its_own():
    """Hagemann et al. ran each layout with and without SP: two rows, two cases."""
    sp = {**RAW["rows"][0], "sp": True, "step_s": 0.9}
    sweep = build_sweep({**RAW, "rows": [RAW["rows"][0], sp]}, _defaults())
    assert [r.case.id for r in sweep.rows] == ["t-tp2-pp1-mb1", "t-tp2-pp1-mb1-sp"]
    assert [r.case.layout.sequence_parallel for r in sweep.rows] == [False, True]
    assert sweeps.measured_best(sweep).id == "t-tp2-pp1-mb1-sp"


@pytest.fixture(scope="module")
def bigscience():
    (sweep,) = [s for s in sweeps.load_sweeps() if s.name == "bigscience22-181b"]
    return sweep, sweeps.evaluate(sweep)


def test_the_bigscience_sweep_is_held_out_of_the_fit(bigscience):
    sweep, _ = bigscience
    ids = {c.id for c in validation.load_cases()} | {c.id for c in validation.load_held_out()}
    assert not ids & {r.case.id for r in sweep.rows}
    assert len(sweep.rows) == 20 and sum(r.oom for r in sweep.rows) == 3
    assert len({r.case.id for r in sweep.rows}) == 20
    assert all(r.case.layout.world == 384 for r in sweep.rows)


def test_bigscience_order_figures_stay_as_docs_planner_states(bigscience):
    """docs/planner.md: steps within a median 8.1%, 11 of 17 inside the printed range; the
    planner's order follows the measured one loosely (Spearman +0.39, 68 of 104 pairs), and its
    own best is the measured second, 1.1% behind. (Before the pipeline engine's cost per layer:
    9.4%, 9 of 17, Spearman -0.03, 47 of 104.)"""
    _, (_, order, _) = bigscience
    assert order["rows"] == 17 and order["pairs_counted"] == 104
    assert 0.06 < order["median_abs_error"] < 0.10   # 8.1%
    assert 9 <= order["in_band"] <= 13               # 11 of 17 inside the printed range
    assert 0.25 < order["spearman"] < 0.55
    assert 60 <= order["pairs_agreeing"] <= 76
    assert order["predicted_best_measured_rank"] <= 3 and order["predicted_best_behind"] < 0.03


def test_bigscience_memory_is_under_predicted_as_stated(bigscience):
    """docs/planner.md: reserved memory a median 17% under nvidia-smi's; the TP 8 x PP 1 and
    TP 2 x PP 6 micro-batch 2 rows predicted not to fit, TP 2 x PP 6 micro-batch 1 (which ran
    out of memory too) predicted to fit."""
    _, (results, _, mem) = bigscience
    assert mem["rows"] == 15 and -0.25 < mem["median_error"] < -0.10
    assert mem["oom_predicted"] == 2 and mem["ran_predicted_to_fit"] == mem["ran"] == 17
    missed = [r.row.case.id for r in results if r.row.oom and r.fits]
    assert missed == ["bigscience22-181b-tp2-pp6-mb1"]


@functools.lru_cache(maxsize=1)
def _by_name():
    return {s.name: (s, sweeps.evaluate(s)) for s in sweeps.load_sweeps()}


def test_bigscience_bf16_sweeps_put_tp4_first_as_measured():
    """docs/planner.md: with BLOOM's final software (bf16, fp32 gradient accumulation, the
    embeddings counted as layers) TP 4 x PP 12 took 7-16% less time than TP 8 x PP 12 for the
    176B and 178B models, and the planner's best is the measured best in both; for the 184B
    model it orders TP 8's micro-batch 2 and 4 as measured (micro-batch 2 15.5% slower; the
    wrong way before the pipeline engine's cost per layer)."""
    found = _by_name()
    for name in ("bigscience22-176b", "bigscience22-178b"):
        _, (results, order, _) = found[name]
        assert order["predicted_best_measured_rank"] == 1, name
        best = max(results, key=lambda r: r.tokens_per_device_s(r.row.case.published_step_s))
        assert best.row.case.layout.tp == 4, name
    _, (_, order, mem) = found["bigscience22-184b"]
    assert order["pairs_agreeing"] == 1 and order["pairs_counted"] == 1
    assert mem["oom_rows"] == 2 and mem["oom_predicted"] == 1


def _pooled(source):
    return sweeps.pooled([ev for s, ev in _by_name().values() if s.source == source])


def _order_figures(sources):
    """(pooled figures, sweeps within 1.1% of the measured best, the worst %) of `sources`."""
    found = [(s, ev) for s, ev in _by_name().values() if s.source in sources]
    behind = [round(100 * o["predicted_best_behind"], 1) for _, (_, o, _) in found]
    return sweeps.pooled([ev for _, ev in found]), sum(b <= 1.1 for b in behind), max(behind)


def test_every_sweep_together_as_stated():
    """docs/planner.md: BigScience's 5 sweeps, 32 layouts: median |error| 5.8%, 26 inside the
    printed range, 87 of 126 pairs, the pick the measured best or within 1.1% of it in all 5,
    memory a median 18% low, 3 of 5 out-of-memory layouts found. With Hagemann et al.'s 10
    (test_hagemann_sweeps_as_stated): the pick within 1.1% in 13 of 15, at worst 25% behind,
    882 of 1091 pairs; the Ultra-Scale Playbook's 22 apart (test_usp_sweeps_as_stated); and
    the note `megatron-plan search` prints says the same."""
    note = ranges.ORDER_EVIDENCE
    for sources, want in ((("bigscience22", "hagemann23"), (15, 162, 13)),
                          (("usp25",), (22, 1052, 11))):
        p, near, worst = _order_figures(sources)
        assert f"{p['pairs_agreeing']} of the {p['pairs_counted']} pairs" in note
        assert f"{p['rows']} layouts in {p['sweeps']} sweeps" in note
        assert f"in {near} of {p['sweeps']}, at worst {worst:.0f}%" in note
        assert (p["sweeps"], p["rows"], near) == want
    big = _pooled("bigscience22")
    assert (big["sweeps"], big["rows"], big["pairs_counted"], big["oom_rows"]) == (5, 32, 126, 5)
    assert 0.045 < big["median_abs_error"] < 0.07 and 23 <= big["in_band"] <= 29
    assert 80 <= big["pairs_agreeing"] <= 95 and big["oom_predicted"] == 3
    assert -0.25 < big["memory_median_error"] < -0.10
    assert _order_figures(("bigscience22",))[2] <= 1.1


def test_hagemann_sweeps_as_stated():
    """docs/planner.md, "Hagemann et al.'s sweeps": 130 layouts that ran in 10 sweeps under
    Aleph Alpha's Scaling (aa-scaling): median |error| 7.9%, 73 inside the printed range, 795
    of 965 pairs ordered as measured; 168 of the 192 layouts that ran out of memory predicted
    not to fit, and of the 130 that ran all but one predicted to fit (65B at TP 8 x PP 4,
    micro-batch 4: 81.1 GiB). Before the engine's gathered SP inputs, whole-vocabulary logits
    and split gate/up projections were priced: 12.0%, 54, 780 and 145; before its eager loss's
    backward peak and its spent buffer slots (Overlap.keeps_spent_outputs), 158. Priced as
    megatron-deepspeed instead (DeepSpeed's pipeline-engine cost of each slot, none of the
    three traits) the order is about the same but the error more than doubles."""
    h = _pooled("hagemann23")
    assert (h["sweeps"], h["rows"], h["pairs_counted"], h["oom_rows"]) == (10, 130, 965, 192)
    assert 0.065 < h["median_abs_error"] < 0.095 and 65 <= h["in_band"] <= 80
    assert 740 <= h["pairs_agreeing"] <= 820 and 160 <= h["oom_predicted"] <= 176
    missed = [r.row.case.id for s, (results, _, _) in _by_name().values()
              if s.source == "hagemann23" for r in results if not r.row.oom and not r.fits]
    assert missed == ["hagemann23-65b-2k-64-sp-tp8-pp4-mb4"]
    note = ranges.engine_note("aa-scaling")
    by_tp = {}
    for name, (_, (results, _, _)) in _by_name().items():
        for r in results:
            if name.startswith("hagemann23") and not r.row.oom:
                by_tp.setdefault(r.row.case.layout.tp, []).append(r.error)
    tp8 = sorted(by_tp[8])[len(by_tp[8]) // 2]
    assert f"median {100 * h['median_abs_error']:.0f}% more time" in note
    assert f"(TP 8: {100 * tp8:.0f}%)" in note and f"{h['in_band']} of the 130" in note
    assert f"{100 * h['pairs_agreeing'] / h['pairs_counted']:.0f}% of the pairs" in note
    assert f"{h['oom_rows'] - h['oom_predicted']} of {h['oom_rows']} layouts" in note
    assert ranges.engine_note("megatron-deepspeed") == ""
    ds = sweeps.pooled([sweeps.evaluate(sweeps.as_engine(s, "megatron-deepspeed"))
                        for s, _ in _by_name().values() if s.source == "hagemann23"])
    assert ds["median_abs_error"] > 2 * h["median_abs_error"]
    assert abs(ds["pairs_agreeing"] - h["pairs_agreeing"]) <= 20


def test_search_prints_how_far_its_order_holds(capsys):
    from megatron.cli.plan import main
    assert main(["search", "--model", "gpt3-1.3b", "--cluster", "a100", "--nodes", "1",
                 "--global-batch", "64", "--top", "3"]) == 0
    assert ranges.ORDER_EVIDENCE in capsys.readouterr().out


def test_smi_ratio_is_what_the_sweeps_reported():
    """ranges.SMI_OVER_PEAK: the least and largest nvidia-smi figure over the predicted
    allocator peak on every sweep row that reports memory."""
    ratios = [r.row.mem_gb / r.peak_gib for s, (results, _, _) in _by_name().values()
              for r in results if r.row.mem_gb and s.source in sweeps.SMI_SOURCES]
    assert len(ratios) == 30
    assert (min(ratios), max(ratios)) == pytest.approx(ranges.SMI_OVER_PEAK, abs=0.006)


def test_memory_warns_only_where_the_smi_ratio_would_not_fit():
    assert ranges.smi_note(50.0, 80.0, "deepspeed") == ""       # 1.43 x 50 = 71.5 of 80
    note = ranges.smi_note(60.0, 80.0, "megatron-deepspeed")    # 1.43 x 60 = 85.8 of 80
    assert "71.4-85.8 GB here against 80 GB" in note and "may not fit" in note
    assert ranges.smi_note(60.0, 80.0, "megatron-core") == ""   # not where the sweeps ran


def test_memory_cli_prints_the_smi_note_on_a_tight_layout(capsys):
    from megatron.cli.plan import main
    args = ["memory", "--model", "gpt3-6.7b", "--cluster", "a100", "--nodes", "1",
            "--global-batch", "64", "--tp", "1", "--pp", "1", "--zero", "1",
            "--recompute", "none", "--micro-batch"]
    assert main(args + ["4"]) == 0     # 73.5 GB allocated at peak, 78.2 reserved of 80
    assert "note on memory: on Megatron-DeepSpeed runs" in capsys.readouterr().out
    assert main(args + ["2"]) == 0     # 54.3 GB at peak: 1.43x is 77.6 of 80
    assert "note on memory" not in capsys.readouterr().out


def test_the_margin_notes_figures_are_what_the_sweeps_and_published_runs_give():
    """ranges.MARGIN_EVIDENCE, recomputed: the held-out sweeps' layouts by their priced share
    of the device (most of those at 80-100% ran out of memory, almost none below), and the
    published runs, which all trained, priced up to MARGIN_HIGH."""
    rows = [(r.reserved_gib / r.row.case.profile.spec.gpu_memory_gb, r.row.oom)
            for s, (results, _, _) in _by_name().values() if s.lists_oom for r in results]
    near = [oom for share, oom in rows if ranges.MARGIN <= share < 1.0]
    below = [oom for share, oom in rows if share < ranges.MARGIN]
    pub = validation.load_published()
    published = [validation.in_sample_profile(c) for c in pub.cases + pub.held_out]
    shares = sorted(peak_memory(c.job, c.layout, p.constants, framework=p.spec.framework)
                    .reserved_gb / p.spec.gpu_memory_gb
                    for c, p in zip(pub.cases + pub.held_out, published))
    high = [x for x in shares if x >= ranges.MARGIN]
    text = ranges.MARGIN_EVIDENCE
    assert f"of the {len(rows)} layouts" in text
    assert f"{sum(near)} of the {len(near)} priced at 80-100%" in text
    assert f"({sum(below)} of the {len(below)} priced lower)" in text
    assert f"{len(high)} of the {len(shares)} published runs" in text
    assert f"at 80-{100 * ranges.MARGIN_HIGH:.0f}%" in text
    assert round(100 * max(shares)) == round(100 * ranges.MARGIN_HIGH)
    assert sum(near) > len(near) / 2 and sum(below) < len(below) / 50
    # docs/planner.md's table ("Near the device the verdict is uncertain both ways")
    bins = [(0, 0.7), (0.7, 0.8), (0.8, 0.9), (0.9, 1.0), (1.0, float("inf"))]
    table = [(sum(lo <= x < hi for x, _ in rows), sum(o for x, o in rows if lo <= x < hi))
             for lo, hi in bins]
    assert table == [(114, 0), (39, 2), (19, 12), (15, 12), (172, 171)]


def test_the_margin_note_is_printed_between_80_and_110_percent_of_the_device():
    assert ranges.margin_note(63.9, 80.0) == "" and ranges.margin_note(88.1, 80.0) == ""
    note = ranges.margin_note(64.0, 80.0)
    assert note.startswith("note on memory: priced at 80% of the device, where the fit verdict "
                           "is uncertain: of the ") and "--memory-fraction 0.8" in note
    assert "rank 1 is reserved at 110%" in ranges.margin_note(88.0, 80.0, "rank 1 is reserved")


def test_memory_search_and_longest_print_the_margin_note_near_the_device(capsys):
    """A layout reserved at 98% of an A100 (memory), the same as search's rank 1 when it is the
    only one its space allows, and the longest sequence (always at the edge): each says the
    verdict is uncertain there; at 72% none does. longest --memory-fraction 0.8 keeps that
    margin, and the sequence it finds is shorter."""
    from megatron.cli.plan import main
    base = ["--model", "gpt3-6.7b", "--cluster", "a100", "--nodes", "1", "--global-batch", "64"]
    layout = ["--tp", "1", "--pp", "1", "--zero", "1", "--recompute", "none", "--micro-batch"]
    assert main(["memory", *base, *layout, "4"]) == 0     # 78.2 GB reserved of 80
    assert "note on memory: priced at 98% of the device" in capsys.readouterr().out
    assert main(["memory", *base, *layout, "2"]) == 0
    assert "where the fit verdict is uncertain" not in capsys.readouterr().out
    space = ["--tp-values", "1", "--pp-values", "1", "--zero-stages", "1", "--recompute-values",
             "none", "--flash", "on", "--sequence-parallel", "off", "--cp-values", "1",
             "--ep-values", "1"]
    assert main(["search", *base, *space, "--micro-batches", "4"]) == 0
    assert "note on memory: rank 1 is reserved at 98% of the device" in capsys.readouterr().out
    assert main(["search", *base, *space, "--micro-batches", "2"]) == 0
    assert "where the fit verdict is uncertain" not in capsys.readouterr().out
    longest = ["longest", "--model", "gpt3-1.3b", "--cluster", "a100", "--nodes", "1",
               "--global-batch", "8", "--cp-values", "1"]
    assert main(longest) == 0
    out = capsys.readouterr().out
    assert "note on memory: the fastest is reserved at" in out
    assert main([*longest, "--memory-fraction", "0.8"]) == 0
    tight = capsys.readouterr().out
    seq = [int(o.split("longest sequence: ")[1].split()[0]) for o in (out, tight)]
    assert seq[1] < seq[0] and "where the fit verdict is uncertain" not in tight


def test_the_micro_batch_sweep_puts_micro_batch_1_last_and_4_first_as_measured():
    """docs/planner.md: at TP 8 the 181B model's step measured 16% longer at micro-batch 1
    than at 4 (PP 6 and 12). With the pipeline engine's cost per layer (fitted to the published
    runs, not to this sweep) the planner prices micro-batch 4 fastest and 1 slowest at both
    depths, every step within 7%, the error 4-5 points apart from micro-batch 4 to 1; with the
    share alone micro-batch 1 was priced no slower and the two were 12-14 points apart."""
    _, (results, _, _) = _by_name()["bigscience22-181b-mb"]
    for pp in (6, 12):
        rows = [r for r in results if r.row.case.layout.pp == pp]
        for key in (lambda r: r.row.case.published_step_s, lambda r: r.predicted_s):
            ordered = [r.row.case.layout.micro_batch for r in sorted(rows, key=key)]
            assert ordered[0] == 4 and ordered[-1] == 1, (pp, ordered)
        err = {r.row.case.layout.micro_batch: r.error for r in rows}
        assert max(abs(e) for e in err.values()) < 0.07 and err[1] - err[4] < 0.07, (pp, err)


def test_usp_sweeps_as_stated():
    """docs/planner.md, "The Ultra-Scale Playbook's sweep": 1052 layouts in 22 sweeps under
    nanotron, held out: median |error| 58% (the planner too fast: each sweep's fastest layout
    a median 15%, the pipelines across nodes 137%), 107 inside the printed range, 21826 of
    30676 pairs ordered as measured, the reported memory a median 9% under the priced peak
    (before the engine's per-micro-batch gradient addition was priced: 63%, 19%, 145%, 50,
    21554); and the note `megatron-plan` prints with --framework nanotron says the same."""
    import statistics
    u = _pooled("usp25")
    assert (u["sweeps"], u["rows"], u["in_band"]) == (22, 1052, 107)
    assert (u["pairs_agreeing"], u["pairs_counted"]) == (21826, 30676)
    assert 0.56 < u["median_abs_error"] < 0.61 and -0.10 < u["memory_median_error"] < -0.08
    found = [(s, ev) for s, ev in _by_name().values() if s.source == "usp25"]
    bests = [sweeps.measured_best(s) for s, _ in found]
    best_errors = [c.published_step_s / validation.preset_step(c) - 1 for c in bests]
    across = [r.error for _, (results, _, _) in found for r in results
              if r.row.case.layout.pp > 1 and r.row.case.layout.world > 8]
    assert 0.13 < statistics.median(best_errors) < 0.17
    assert 1.32 < statistics.median(across) < 1.42
    note = ranges.engine_note("nanotron")
    assert f"median {100 * u['median_abs_error']:.0f}% more time" in note
    assert f"fastest layout {100 * statistics.median(best_errors):.0f}%" in note
    assert f"across nodes {100 * statistics.median(across):.0f}%" in note
    assert f"{u['in_band']} of the {u['rows']} inside" in note
    assert f"{100 * u['pairs_agreeing'] / u['pairs_counted']:.0f}% of the pairs" in note
    assert f"median {-100 * u['memory_median_error']:.0f}% under" in note
