"""The planner against published layout sweeps held out of every fit (published.yaml, sweeps).

A sweep is one model on one machine measured at many layouts: the test of what `megatron-plan
search` does, putting layouts in order. BigScience's sweeps before BLOOM (bigscience22: on 48
Jean Zay nodes of 8 A100 80 GB under Megatron-DeepSpeed) give a 181B GPT in fp16 at ZeRO-1, 17
layouts that ran, with seconds per iteration and nvidia-smi memory, and 3 that ran out of
memory; the same model at TP 8 by micro-batch, 7 more (an earlier day's tables); and three
more models with BLOOM's final bf16 software, 8 layouts and 2. Each
row is priced with the presets (what `megatron-plan --cluster a100` prices, the curves with the
BF16 fit of the published cases, which never saw a sweep), and planner/sweeps.py compares:

- order: Spearman's rank correlation between predicted and measured tokens/s per device; the
  share of pairs measured more than the source's repeat noise apart that the planner orders
  the same way; the measured best's place in the predicted order and the reverse;
- memory: predicted reserved memory against the reported, and the out-of-memory rows.

Hagemann et al.'s sweeps (hagemann23: Llama 13B, 30B and 65B on 32-256 DGX A100 under Aleph
Alpha's Scaling engine) give 130 more layouts that ran, with seconds per step, and 192 that
ran out of memory, in 10 sweeps; the measured best of each is the most efficient layout the
paper found for that model, sequence and device count. The Ultra-Scale Playbook's (usp25:
Llama-shaped 1B-80B on 8-256 H100 under nanotron) give 1052 more in 22 sweeps, tokens/s per
GPU and the memory the figure reports, each sweep's fastest a layout chosen by measurement.

A diagnostic column prices each row again with one assumption changed: for BigScience's, the
output layer's time taken off the last stage (the vocabulary cut to 51200, every other term
the same): how much of each error the last stage's share of the 250k-vocabulary output layer
carries; for Hagemann et al.'s, the engine priced as `megatron-deepspeed` (DeepSpeed's
pipeline-engine cost of each slot, its overlap claim, a bf16 reduce-scatter) instead of
`aa-scaling`; for the Playbook's, as `megatron-lm` (an even stage split, the gradient
reduction exposed in bf16) instead of `nanotron`. The summary gives Hagemann et al.'s figures
under each engine the planner prices that resembles theirs.

It measures nothing. Results: benchmarks/results/planner_sweep.{json,md}.

    .venv/bin/python benchmarks/planner_sweep.py"""
from __future__ import annotations

import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from megatron.planner import sweeps, validation  # noqa: E402
from megatron.planner.emit import format_table  # noqa: E402
from megatron.planner.timing import step_time  # noqa: E402
from planner_results import write_results  # noqa: E402

SMALL_VOCAB = 51200


# Hagemann et al.'s engine against the priced engines that resemble it (the summary's lines)
ENGINE_VARIANTS = ("megatron-deepspeed", "megatron-lm-2021")


def small_vocab_step(case) -> float:
    """The row's step with the vocabulary cut to SMALL_VOCAB (BigScience's diagnostic)."""
    job = dataclasses.replace(case.job,
                              model=dataclasses.replace(case.job.model, vocab_size=SMALL_VOCAB))
    return step_time(job, case.layout, validation.in_sample_profile(case)).step_s


# each source's diagnostic: its column's title and the step it prices
DIAGNOSTICS = {
    "bigscience22": (f"error, vocabulary {SMALL_VOCAB}", small_vocab_step),
    "hagemann23": ("error as megatron-deepspeed", lambda c: validation.preset_step(
        sweeps.reframed(c, "megatron-deepspeed"))),
    # nanotron's rows as Megatron-LM's (an even stage split, the reduction exposed in bf16)
    "usp25": ("error as megatron-lm", lambda c: validation.preset_step(
        sweeps.reframed(c, "megatron-lm"))),
}


def row_dict(r: sweeps.RowResult) -> dict:
    c = r.row.case
    lay = c.layout
    diag = None if r.row.oom else c.published_step_s / DIAGNOSTICS[c.source][1](c) - 1
    return {"case": c.id, "tp": lay.tp, "pp": lay.pp, "dp": lay.dp,
            "micro_batch": lay.micro_batch, "sp": lay.sequence_parallel,
            "batch": c.job.global_batch, "measured_s": c.published_step_s,
            "predicted_s": r.predicted_s, "error": r.error, "diagnostic_error": diag,
            "measured_gb": r.row.mem_gb, "band_s": list(r.band_s), "in_band": r.in_band,
            "reserved_gib": r.reserved_gib, "fits": r.fits, "oom": r.row.oom}


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def markdown(sweep, rows, order, mem) -> str:
    title = DIAGNOSTICS[sweep.source][0]
    header = ("TP", "PP", "DP", "SP", "micro-batch", "batch", "measured s", "predicted s",
              "error", "printed range s", title, "memory GB", "reserved GiB")
    body = [[str(r["tp"]), str(r["pp"]), str(r["dp"]), "yes" if r["sp"] else "-",
             str(r["micro_batch"]), str(r["batch"]),
             "out of memory" if r["oom"] else f"{r['measured_s']:.2f}",
             f"{r['predicted_s']:.2f}", _pct(r["error"]),
             f"{r['band_s'][0]:.0f}-{r['band_s'][1]:.0f}"
             + ("" if r["oom"] else (" (in)" if r["in_band"] else " (out)")),
             _pct(r["diagnostic_error"]),
             "-" if r["measured_gb"] is None else f"{r['measured_gb']:g}",
             f"{r['reserved_gib']:.1f}" + ("" if r["fits"] else " (does not fit)")]
            for r in rows]
    return "\n".join([
        f"# Layout sweep held out of every fit: {sweep.name}", "",
        "Generated by benchmarks/planner_sweep.py (no measurement). " + sweep.what + " "
        f"(source {sweep.source}, published.yaml `sweeps`), priced with the "
        f"{sweep.rows[0].case.profile.spec.name} preset as "
        "`megatron-plan` prices it; no fit saw these rows. error: predicted over measured "
        "throughput, minus 1 (positive: the planner is too fast). printed range: what "
        "`megatron-plan memory` prints for the row (its settings' range widened by the model's "
        "error band, planner/ranges.py); in/out: whether the measured step lies inside. "
        f"{title}: the same with one assumption changed, a diagnostic (the script's "
        "docstring). memory GB: what the source reported (nvidia-smi's for BigScience's, the "
        "Playbook's own counter for usp25's); reserved GiB: "
        "the planner's `peak x (1 + frag) + framework_gb`.", "",
        format_table(header, body), "",
        f"Step time over the {order['rows']} layouts that ran: median |error| "
        f"{100 * order['median_abs_error']:.1f}%; the measured step inside the printed range "
        f"for {order['in_band']} of {order['rows']}. "
        f"Order (tokens/s per device): Spearman's "
        f"rank correlation {order['spearman']:+.2f}; of the {order['pairs_counted']} pairs "
        f"measured more than {100 * sweep.min_gap:.0f}% apart (the source's repeat noise), "
        f"{order['pairs_agreeing']} ordered as measured "
        f"({100 * order['pairs_agreeing'] / max(1, order['pairs_counted']):.0f}%); the "
        f"measured best is {order['measured_best_predicted_rank']} of {order['rows']} in the "
        f"predicted order; the predicted best is {order['predicted_best_measured_rank']} of "
        f"{order['rows']} measured, {100 * order['predicted_best_behind']:.1f}% behind the "
        "measured best.", "",
        (f"Memory over the {mem['rows']} rows with a figure: predicted reserved over "
         f"reported, minus 1: median {100 * mem['median_error']:+.1f}%, lowest "
         f"{100 * mem['max_under']:+.1f}%; " if mem["rows"] else
         "Memory: the source reports no figure; ")
        + f"{mem['oom_predicted']} of the {mem['oom_rows']} rows that ran out of memory "
        f"predicted not to fit; {mem['ran_predicted_to_fit']} of the {mem['ran']} that ran "
        "predicted to fit.", ""])


def pooled_line(title: str, p) -> str:
    return (f"- {title}: {p['sweeps']} sweeps, {p['rows']} layouts that ran: median |error| "
            f"{100 * p['median_abs_error']:.1f}%; {p['in_band']} inside the printed range; "
            f"{p['pairs_agreeing']} of {p['pairs_counted']} pairs ordered as measured "
            f"({100 * p['pairs_agreeing'] / max(1, p['pairs_counted']):.0f}%); "
            f"{p['oom_predicted']} of the {p['oom_rows']} out-of-memory layouts predicted not "
            f"to fit, {p['ran_predicted_to_fit']} of the {p['ran']} that ran predicted to fit")


def summary(p, by_source, engines) -> str:
    return "\n".join([
        "# All sweeps together", "",
        f"{p['sweeps']} sweeps, {p['rows']} layouts that ran: median |error| "
        f"{100 * p['median_abs_error']:.1f}%; the measured step inside the printed range for "
        f"{p['in_band']} of {p['rows']}; of the {p['pairs_counted']} pairs within a sweep "
        f"measured apart beyond its noise, {p['pairs_agreeing']} ordered as measured "
        f"({100 * p['pairs_agreeing'] / max(1, p['pairs_counted']):.0f}%); reserved memory a "
        f"median {100 * p['memory_median_error']:+.1f}% against the {p['memory_rows']} reported "
        f"figures; {p['oom_predicted']} of the {p['oom_rows']} layouts that ran out of memory "
        "predicted not to fit.", "", "By source, and Hagemann et al.'s sweeps priced as the "
        "other engines that resemble Aleph Alpha's Scaling (overlap.py):", ""]
        + [pooled_line(src, x) for src, x in by_source.items()]
        + [pooled_line(f"hagemann23 as {fw}", x) for fw, x in engines.items()] + [""])


def engine_variant(loaded, framework: str):
    """Hagemann et al.'s sweeps (of `loaded`) with every row priced as the engine
    `framework`."""
    return sweeps.pooled([sweeps.evaluate(sweeps.as_engine(s, framework))
                          for s in loaded if s.source == "hagemann23"])


def main() -> int:
    out, texts, evaluated = [], [], []
    by_source = {}
    loaded = sweeps.load_sweeps()
    for sweep in loaded:
        results, order, mem = sweeps.evaluate(sweep)
        evaluated.append((results, order, mem))
        by_source.setdefault(sweep.source, []).append((results, order, mem))
        rows = [row_dict(r) for r in results]
        out.append({"sweep": sweep.name, "source": sweep.source, "rows": rows,
                    "order": order, "memory": mem})
        texts.append(markdown(sweep, rows, order, mem))
    together = sweeps.pooled(evaluated)
    sources = {src: sweeps.pooled(ev) for src, ev in by_source.items()}
    engines = {fw: engine_variant(loaded, fw) for fw in ENGINE_VARIANTS}
    texts.append(summary(together, sources, engines))
    text = "\n".join(texts)
    write_results("planner_sweep", {"sweeps": out, "pooled": together, "by_source": sources,
                                    "hagemann23_as": engines}, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
