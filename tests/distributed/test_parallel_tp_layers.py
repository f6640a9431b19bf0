"""Tensor-parallel layers, mappings, cross-entropy, RNG tracker, recompute and the rank grid,
each against an unsharded reference, on 4 CPU ranks (gloo) in one torchrun launch.

The launch runs every check (tp_layers_worker.py); each check is then reported as its own test,
named after the layer/mapping and the TP size, so a failure localizes."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.support import tp_layers_worker
from tests.support.procs import torchrun_cmd

WORKER = tp_layers_worker.__file__
WORLD = 4
NAMES = [name for name, _, _ in tp_layers_worker.checks(WORLD)]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp_layers")
    cmd = [*torchrun_cmd(WORLD), WORKER, str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    per_rank = []
    for rank in range(WORLD):
        path = out / f"rank{rank}.json"
        if not path.exists():
            pytest.fail(f"rank {rank} wrote no results (exit {proc.returncode}):\n"
                        f"{proc.stderr[-4000:]}")
        per_rank.append(json.loads(path.read_text()))
    return per_rank


@pytest.mark.parametrize("name", NAMES)
def test_tp(results, name):
    failures = [r[name]["detail"] for r in results if not r[name]["ok"]]
    assert not failures, f"{name} failed:\n" + "\n".join(failures)
