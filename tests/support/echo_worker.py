"""A stand-in worker for tests/integration/test_test_shared_launches.py: writes its --value and
how many times this module's main ran in this import of it (1 when each job imports it anew),
or fails when --fail is given."""
from __future__ import annotations

import argparse
import json
import os

RUNS: list = []  # module state a second job must not see


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--value", default="")
    p.add_argument("--fail", action="store_true")
    args = p.parse_args()
    RUNS.append(args.value)
    if args.fail:
        raise RuntimeError(f"echo_worker failed as asked ({args.value})")
    if int(os.environ.get("RANK", "0")) == 0:
        with open(args.out, "w") as f:
            json.dump({args.value: {"runs_in_this_import": len(RUNS)}}, f)
    return 0
