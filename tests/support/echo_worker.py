"""A stand-in worker for tests/integration/test_test_shared_launches.py: writes its --value and
how many times this module's main ran in this import of it (1 when each job imports it anew),
or fails when --fail is given (or on --fail-rank, while the others hang)."""
from __future__ import annotations

import argparse
import json
import os
import time

RUNS: list = []  # module state a second job must not see


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--value", default="")
    p.add_argument("--fail", action="store_true")
    p.add_argument("--fail-rank", type=int, default=-1,
                   help="this rank fails and every other one sleeps, as if stuck, until ended")
    p.add_argument("--fail-once", default="", help="fails unless this file exists, then makes it")
    args = p.parse_args()
    RUNS.append(args.value)
    if args.fail_once and not os.path.exists(args.fail_once):
        open(args.fail_once, "w").close()
        raise RuntimeError(f"echo_worker failed once as asked ({args.value})")
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.fail_rank >= 0 and rank != args.fail_rank:
        open(f"{args.out}.hanging{rank}", "w").close()
        time.sleep(600)
    if args.fail_rank >= 0 and rank == args.fail_rank:
        # fail only once every other rank hangs where the launcher's SIGTERM will find it: on a
        # loaded machine a rank still starting up had no stack to show yet (a flaky test)
        others = [f"{args.out}.hanging{r}" for r in range(world) if r != rank]
        deadline = time.monotonic() + 120
        while not all(map(os.path.exists, others)) and time.monotonic() < deadline:
            time.sleep(0.05)
    if args.fail or rank == args.fail_rank:
        raise RuntimeError(f"echo_worker failed as asked ({args.value})")
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({args.value: {"runs_in_this_import": len(RUNS)}}, f)
    return 0
