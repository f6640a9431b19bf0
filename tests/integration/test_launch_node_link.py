"""The node link check (issue 20 item 3, launch/health.py check_node_link): after the rendezvous
the ranks of each node all-reduce 16 MiB among themselves; a node slower than the floor fails.
Four gloo ranks on a roster of two nodes: each node's pair passes the default floor and fails an
impossible one, naming its own 2 ranks; then megatron-train on two ranks with an impossible
floor ends with exit 5 naming the node, which goes into bad_nodes."""
import json
import subprocess

import pytest

from megatron.base.rundir import RunDir
from tests.support.cli import clean_env, sets
from tests.support.paths import ROOT, TINY
from tests.support.procs import torchrun_cmd

pytestmark = pytest.mark.slow  # two torchrun launches: about 30 s


def test_each_node_times_its_own_ranks_and_a_slow_link_is_named(tmp_path):
    cmd = [*torchrun_cmd(4), "-m", "tests.support.node_link_worker", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, env=clean_env(OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert sorted(x["rank"] for x in lines) == [0, 1, 2, 3]
    for x in lines:
        assert x["healthy"] == [], x
        (problem,) = x["broken"]
        assert "among the node's 2 ranks" in problem and "MEGATRON_HEALTH_MIN_GBPS" in problem
        # each check's node groups end with it (a process training several runs kept them)
        assert x["groups_left"] == 0, x


def test_megatron_train_refuses_a_node_whose_link_is_too_slow(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    cmd = [*torchrun_cmd(2), "-m", "megatron.cli.train", "--config", TINY,
           *sets(f"run.dir={run.path}", "training.train_iters=2", "training.tensorboard=false")]
    done = subprocess.run(cmd, cwd=ROOT, env=clean_env(OMP_NUM_THREADS="1",
                                                       MEGATRON_HEALTH_MIN_GBPS="1e6"),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode != 0 and "(exitcode: 5)" in done.stderr, done.stderr[-3000:]
    assert "failed its health check: an all-reduce of 16 MiB among the node's 2 ranks" in \
        done.stderr, done.stderr[-3000:]
    assert len(run.read_bad_nodes()) == 1
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # not a step was trained
