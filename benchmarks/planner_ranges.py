"""How often the published figure falls inside the planner's predicted range
(megatron/planner/ranges.py, range_validation.py): every published case predicted by the fit
without its source, over the settings the publication leaves open (its assumed micro-batch),
the engine's overlap assumption and the interconnect's efficiency (+-15%). Writes
benchmarks/results/planner_ranges.{json,md}; docs/planner.md ("Ranges") quotes them. Runs in
about ten seconds on a CPU (no measurement).

    .venv/bin/python benchmarks/planner_ranges.py"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from megatron.planner import range_validation as rv, ranges, validation as v  # noqa: E402
from megatron.planner.emit import format_table  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    pairs = rv.case_ranges(v.leave_one_out(v.load_cases()))
    cov = rv.coverage(pairs)
    rows = [[r.case.id, r.case.source, f"{r.case.published_step_s:.4g}", f"{g.point_s:.4g}",
             f"{g.low_s:.4g}-{g.high_s:.4g}", f"{100 * g.width:.1f}%", g.widest,
             "yes" if g.contains(r.case.published_step_s) else "no"] for r, g in pairs]
    md = ["# Published step times against the planner's predicted range", "",
          f"Settings spanned: {', '.join(ranges.SETTINGS)} (micro-batch only where the source "
          f"leaves it open; interconnect efficiency +-{100 * ranges.INTERCONNECT:.0f}%); "
          "each case predicted by the fit without its source (leave-one-source-out).", "",
          format_table(("case", "source", "published s", "point s", "range s", "width",
                        "moved most by", "inside"), rows), "",
          f"Inside the range: {cov['inside']} of {cov['cases']} ({100 * cov['coverage']:.0f}%); "
          f"median width {100 * cov['median_width']:.1f}% of the point, max "
          f"{100 * cov['max_width']:.1f}%; moved most by: "
          + ", ".join(f"{k} {n}" for k, n in cov["widest"].items()) + "."]
    out = os.path.join(HERE, "results", "planner_ranges")
    with open(out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    record = {"coverage": cov, "interconnect": ranges.INTERCONNECT,
              "rows": [{"id": r.case.id, "published_s": r.case.published_step_s,
                        "point_s": round(g.point_s, 6), "low_s": round(g.low_s, 6),
                        "high_s": round(g.high_s, 6), "widest": g.widest,
                        "inside": g.contains(r.case.published_step_s)} for r, g in pairs]}
    with open(out + ".json", "w") as f:
        json.dump(record, f, indent=1)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
