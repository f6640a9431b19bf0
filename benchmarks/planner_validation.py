"""The planner against published training runs, leave one case out and leave one source out
(megatron/planner/validation.py).

For every case of megatron/planner/published.yaml: the published hardware TFLOP/s per device
(recomputed FLOPs counted, as the sources count them), the prediction from the per-device
curves alone, the prediction of a fit of all other cases (leave-one-out), and what the shipped
preset predicts (in sample: the presets carry the fit of all cases); then the fit on all cases,
the published orderings, and where each published layout ranks among all fitting layouts of
its settings. Writes benchmarks/results/planner_validation.{json,md}; docs/planner.md quotes
the tables. Runs in a few seconds on a CPU (no measurement).

    .venv/bin/python benchmarks/planner_validation.py"""
from __future__ import annotations

import json
import os
import statistics
import sys


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from megatron.planner import breakdown, ranges, sweeps  # noqa: E402
from megatron.planner import validation as v  # noqa: E402
from megatron.planner.emit import format_table  # noqa: E402
from megatron.planner.layout import layout_ends  # noqa: E402
from megatron.planner.memory import peak_memory  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _layout(c: v.Case) -> str:
    lay = c.layout
    extra = [lay.recompute]
    if lay.sequence_parallel:
        extra.append("SP")
    if lay.flash:
        extra.append("flash")
    if lay.interleave > 1:
        extra.append(f"interleaved v{lay.interleave}")
    if lay.counted:
        first, last = layout_ends(c.job.model.num_layers, lay)
        ends = [name for name, on in (("embedding", lay.embedding_as_layer),
                                      ("head", lay.loss_as_layer)) if on]
        extra.append(f"{' and '.join(ends)} counted as a layer (first/last chunk {first}/{last} "
                     "layers)")
    elif lay.uneven:
        extra.append(f"first/last {lay.first_stage_layers}/{lay.last_stage_layers} layers")
    if c.job.grad_dtype:
        extra.append(f"{c.job.grad_dtype} gradient reduction")
    cp = f" CP{lay.cp} {lay.cp_label()}" if lay.cp > 1 else ""
    return (f"TP{lay.tp}{cp} PP{lay.pp} DP{lay.dp}, mb {lay.micro_batch}, "
            f"gb {c.job.global_batch}, ZeRO-{lay.zero}, {' '.join(extra)}")


def _gap(k) -> str:
    """The two step terms that differ most between a published layout and the predicted best
    (planner/breakdown.py), where it is behind."""
    if not k.behind:
        return "-"
    prof = v.in_sample_profile(k.case)
    slow = breakdown.step_breakdown(k.case.job, k.case.layout, prof)
    return breakdown.explain_gap(slow, breakdown.step_breakdown(k.case.job, k.best, prof), 2)


def _unfit_shares(ranked) -> str:
    """' (id at N% of the device, ...: inside the band ...)' for layouts priced not to fit."""
    shares = []
    for k in ranked:
        if k.rank is None:
            prof = v.in_sample_profile(k.case)
            mem = peak_memory(k.case.job, k.case.layout, prof.constants,
                              framework=prof.spec.framework)
            shares.append(f"{k.case.id} {100 * mem.reserved_gb / prof.spec.gpu_memory_gb:.0f}%")
    if not shares:
        return ""
    return (f" (reserved at {', '.join(shares)} of the device, inside the "
            f"{100 * ranges.MARGIN:.0f}-{100 * ranges.MARGIN_HIGH:.0f}% where the fit verdict is "
            "uncertain: docs/planner.md, Memory)")


def main() -> int:
    pub = v.load_published()
    rows = v.leave_one_out(pub.cases)
    summary = v.summary(rows)
    factors = v.fit_factors(pub.cases)
    cases = pub.by_id()
    orderings = []
    for comp in pub.comparisons:
        ok_prior, _ = v.ordering_holds(comp, cases)
        ok_fit, rates = v.ordering_holds(comp, cases, factors)
        orderings.append({"source": comp.source, "what": comp.what, "order": list(comp.order),
                          "best_of": comp.best, "known_failure": comp.known_failure,
                          "holds_prior": ok_prior, "holds_fitted": ok_fit,
                          "tokens_per_device_s": [round(r, 1) for r in rates]})
    preset = {r.case.id: v.preset_step(r.case) for r in rows}
    in_sample = [r.case.published_step_s / preset[r.case.id] - 1 for r in rows]
    header = ("case", "source", "layout", "devices", "published", "prior", "held out", "error",
              "source held out", "error", "preset (in sample)", "error")
    table = [[r.case.id, r.case.source, _layout(r.case), str(r.case.layout.world),
              f"{r.published_tflops:.1f}", f"{r.tflops(r.prior_step_s):.1f}",
              f"{r.tflops(r.loo_step_s):.1f}", f"{100 * r.loo_error:+.1f}%",
              f"{r.tflops(r.loso_step_s):.1f}", f"{100 * r.loso_error:+.1f}%",
              f"{r.tflops(preset[r.case.id]):.1f}", f"{100 * e:+.1f}%"]
             for r, e in zip(rows, in_sample)]
    sources = v.by_source(rows)
    source_rows = [[src, str(x["cases"]), f"{100 * x['loo_median']:.1f}%",
                    f"{100 * x['loo_max']:.1f}%", f"{100 * x['loso_median']:.1f}%",
                    f"{100 * x['loso_max']:.1f}%"] for src, x in sources.items()]
    ranks = [v.rank_published_layout(c) for c in pub.cases]
    # held out of every fit and chosen for speed (glm22, the measured bests of Hagemann et
    # al.'s sweeps): ranked beside, counted apart
    held = [v.rank_published_layout(c) for c in pub.held_out if c.source in v.CHOSEN_FOR_SPEED]
    held += [v.rank_published_layout(sweeps.measured_best(s)) for s in sweeps.load_sweeps()
             if s.source in sweeps.CHOSEN_BY_SWEEP]
    held_out = {id(k) for k in held}
    rank_rows = [[k.case.id, ("yes, held out" if id(k) in held_out else "yes")
                  if id(k) in held_out or k.case.source in v.CHOSEN_FOR_SPEED else "no",
                  f"TP{k.case.layout.tp}{f' CP{k.case.layout.cp}' if k.case.layout.cp > 1 else ''}"
                  f" PP{k.case.layout.pp} DP{k.case.layout.dp}",
                  "does not fit" if k.rank is None else f"{k.rank}/{k.fitting}",
                  f"TP{k.best.tp} PP{k.best.pp} DP{k.best.dp}" if k.best else "-",
                  "-" if k.behind is None else f"{100 * k.behind:.1f}%", _gap(k)]
                 for k in ranks + held]
    picked = [k for k in ranks if k.case.source in v.CHOSEN_FOR_SPEED]
    chosen = [k.behind for k in picked if k.behind is not None]  # those priced to fit
    top3 = sum(k.rank is not None and k.rank <= 3 for k in picked)
    abs_in = sorted(abs(e) for e in in_sample)
    names = list(v.GROUPS)
    md = ["# Planner validation against published runs (leave one case out, leave one source out)", "",
          "Hardware TFLOP/s per device (recomputed FLOPs counted). prior: the per-device "
          "curves alone; held out: fitted on every other case. "
          "Generated by benchmarks/planner_validation.py.", "",
          format_table(header, table), "",
          f"|error| held out: median {100 * summary['loo_median']:.1f}%, max "
          f"{100 * summary['loo_max']:.1f}% over {summary['cases']} cases; prior alone: median "
          f"{100 * summary['prior_median']:.1f}%, max {100 * summary['prior_max']:.1f}%; "
          f"shipped presets (in sample): median {100 * abs_in[len(abs_in) // 2]:.1f}%, max "
          f"{100 * abs_in[-1]:.1f}%.", "",
          f"|error| with the case's whole source held out: median "
          f"{100 * summary['loso_median']:.1f}%, max {100 * summary['loso_max']:.1f}% "
          f"({summary['cases']} cases, {summary['sources']} sources, {summary['devices']} "
          "device kinds). By source:", "",
          format_table(("source", "cases", "case held out: median", "max",
                        "source held out: median", "max"), source_rows), "",
          "Fit on all cases: " + ", ".join(f"{n} {x:.3g}" for n, x in zip(names, factors)), "",
          "Orderings (fastest first, or the first against each of the others): "]
    md += [f"- {o['source']}: {o['what']}: prior {'holds' if o['holds_prior'] else 'FAILS'}, "
           f"fitted {'holds' if o['holds_fitted'] else 'FAILS'} "
           f"({', '.join(f'{i} {r}' for i, r in zip(o['order'], o['tokens_per_device_s']))} "
           "tokens/s per device)" for o in orderings]
    md += ["", "Published layouts among all fitting layouts of their settings (shipped presets, "
           "Megatron-LM runs without the pipeline engine's share; behind: predicted "
           "tokens/s of the best over the published layout's, minus 1; where: the step terms "
           "of planner/breakdown.py that differ most, published minus best):", "",
           format_table(("case", "chosen for speed", "published", "rank", "predicted best",
                         "behind", "where"), rank_rows), "",
           f"Chosen for speed: {len(picked)} layouts, {len(picked) - len(chosen)} of them "
           f"priced not to fit{_unfit_shares(picked)}; those that fit behind the predicted best by median "
           f"{100 * statistics.median(chosen):.1f}%, max {100 * max(chosen):.1f}%; "
           f"{sum(b == 0 for b in chosen)} ranked first, {top3} in the top 3 "
           f"({100 * top3 / len(picked):.0f}%), {sum(b <= 0.10 for b in chosen)} within 10%.",
           "", f"Held out of every fit and chosen for speed: {len(held)} layouts "
           f"({', '.join(f'{k.case.id} {k.rank}/{k.fitting}' for k in held)}); "
           f"{sum(k.rank is not None and k.rank <= 3 for k in held)} of them in the top 3; "
           f"with them {top3 + sum(k.rank is not None and k.rank <= 3 for k in held)} of "
           f"{len(picked) + len(held)} in the top 3."]
    out = os.path.join(HERE, "results", "planner_validation")
    with open(out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    record = {"summary": summary, "by_source": sources, "fit_all": dict(zip(names, map(float, factors))),
              "rows": [{"id": r.case.id, "source": r.case.source, "layout": _layout(r.case),
                        "devices": r.case.layout.world, "assumed": list(r.case.assumed),
                        "published_hw_tflops": round(r.published_tflops, 2),
                        "prior_hw_tflops": round(r.tflops(r.prior_step_s), 2),
                        "held_out_hw_tflops": round(r.tflops(r.loo_step_s), 2),
                        "held_out_error": round(r.loo_error, 4),
                        "held_out_fit": [round(x, 4) for x in r.factors],
                        "source_held_out_hw_tflops": round(r.tflops(r.loso_step_s), 2),
                        "source_held_out_error": round(r.loso_error, 4),
                        "source_held_out_fit": [round(x, 4) for x in r.loso_factors],
                        "preset_in_sample_hw_tflops": round(r.tflops(preset[r.case.id]), 2),
                        "preset_in_sample_error": round(e, 4)}
                       for r, e in zip(rows, in_sample)],
              "ranks": [{"id": k.case.id, "chosen_for_speed": k.case.source in v.CHOSEN_FOR_SPEED,
                         "rank": k.rank, "fitting": k.fitting,
                         "best": k.best.key() if k.best else None,
                         "behind": None if k.behind is None else round(k.behind, 4)}
                        for k in ranks + held],
              "orderings": orderings}
    with open(out + ".json", "w") as f:
        json.dump(record, f, indent=1)
    print("\n".join(md))
    return 0 if summary["loo_max"] <= 0.25 and summary["loo_median"] <= 0.15 else 1


if __name__ == "__main__":
    sys.exit(main())
