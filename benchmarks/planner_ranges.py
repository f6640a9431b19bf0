"""How often the published figure falls inside the planner's predicted range
(megatron/planner/ranges.py, range_validation.py): every published case predicted by the fit
without its source, over the settings the publication leaves open (its assumed micro-batch),
the engine's overlap assumption and the interconnect's efficiency (+-15%); then that range
widened by the time model's error band, each source's band taken from the other sources' held-out
errors alone. Writes benchmarks/results/planner_ranges.{json,md}; docs/planner.md ("Ranges")
quotes them. Runs in a few seconds on a CPU (no measurement).

    .venv/bin/python benchmarks/planner_ranges.py"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from megatron.planner import range_validation as rv, ranges, validation as v  # noqa: E402
from megatron.planner.emit import format_table  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = ("case", "source", "published s", "point s", "settings range s", "width", "moved most by",
          "inside", "with model band s", "inside")


def _row(r, g):
    pub = r.case.published_step_s
    return [r.case.id, r.case.source, f"{pub:.4g}", f"{g.point_s:.4g}",
            f"{g.low_s:.4g}-{g.high_s:.4g}", f"{100 * g.width:.1f}%", g.widest,
            "yes" if g.contains(pub) else "no", f"{g.band_low_s:.4g}-{g.band_high_s:.4g}",
            "yes" if g.band_contains(pub) else "no"]


def _summary(cov, bands) -> list:
    return [f"Settings alone: {cov['inside']} of {cov['cases']} inside "
            f"({100 * cov['coverage']:.0f}%); median width {100 * cov['median_width']:.1f}% of "
            f"the point, max {100 * cov['max_width']:.1f}%; moved most by: "
            + ", ".join(f"{k} {n}" for k, n in cov["widest"].items()) + ".", "",
            f"With the model's band (per source, from the other sources' held-out errors: "
            + ", ".join(f"{s} {100 * b:.1f}%" for s, b in bands.items()) + "): "
            f"{cov['inside_band']} of {cov['cases']} inside ({100 * cov['band_coverage']:.0f}%, "
            f"target {100 * ranges.COVERAGE:.0f}%); median width "
            f"{100 * cov['median_band_width']:.1f}% of the point, max "
            f"{100 * cov['max_band_width']:.1f}%. The CLI's band, from all {cov['cases']} cases: "
            f"+-{100 * ranges.MODEL_ERROR:.1f}%."]


def main() -> int:
    cases = v.load_cases()
    bands = rv.source_bands(cases)
    pairs = rv.case_ranges(v.leave_one_out(cases), bands)
    cov = rv.coverage(pairs)
    md = ["# Published step times against the planner's predicted range", "",
          f"Settings spanned: {', '.join(ranges.SETTINGS)} (micro-batch only where the source "
          f"leaves it open; interconnect efficiency +-{100 * ranges.INTERCONNECT:.0f}%; fp8 "
          "and moe_balance only for FP8 and MoE jobs, of which the cases have none); "
          "each case predicted by the fit without its source (leave-one-source-out).", "",
          format_table(HEADER, [_row(r, g) for r, g in pairs]), ""] + _summary(cov, bands)
    out = os.path.join(HERE, "results", "planner_ranges")
    with open(out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    record = {"coverage": cov, "interconnect": ranges.INTERCONNECT,
              "model_error": ranges.MODEL_ERROR,
              "source_bands": {s: round(b, 6) for s, b in bands.items()},
              "rows": [{"id": r.case.id, "published_s": r.case.published_step_s,
                        "point_s": round(g.point_s, 6), "low_s": round(g.low_s, 6),
                        "high_s": round(g.high_s, 6), "widest": g.widest,
                        "inside": g.contains(r.case.published_step_s),
                        "band_low_s": round(g.band_low_s, 6),
                        "band_high_s": round(g.band_high_s, 6),
                        "inside_band": g.band_contains(r.case.published_step_s)}
                       for r, g in pairs]}
    with open(out + ".json", "w") as f:
        json.dump(record, f, indent=1)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
