"""Where the planner's report scripts put what they computed: benchmarks/results/NAME.json (the
record) and NAME.md (the text, also printed). Imported by its siblings as `planner_results`."""
from __future__ import annotations

import json
import os

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def write_results(name: str, record: dict, text: str) -> None:
    with open(os.path.join(RESULTS, f"{name}.json"), "w") as f:
        json.dump(record, f, indent=1)
    with open(os.path.join(RESULTS, f"{name}.md"), "w") as f:
        f.write(text)
    print(text)
