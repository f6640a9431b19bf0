"""A corrupted optimizer state through megatron-train on 2 ranks (issue 40 item 4): the test hook
multiplies the largest first moment of rank 1's ZeRO-1 shard by 1e20 after the update of step 3
(a flipped exponent bit); the run stops in that step with exit 5 and a message naming rank 1,
writes a state_suspect event and the node into bad_nodes, and commits no checkpoint of step 3
although it saves every step. Without the hook the same run trains to the end: the check passes
healthy steps (every other test runs with it on too)."""
import subprocess

import pytest

from megatron.base import faults
from megatron.base.records import events, read_metrics, steps
from megatron.base.rundir import RunDir
from tests.support.cli import clean_env, sets
from tests.support.paths import ROOT, TINY
from tests.support.procs import torchrun_cmd

pytestmark = pytest.mark.slow  # one torchrun launch of two ranks: about 30 s

TRAIN = ("training.train_iters=6", "training.save_interval=1", "training.tensorboard=false",
         "training.global_batch_size=4", "model.num_layers=2", "parallel.zero_stage=1",
         "training.precision=fp32")


def test_a_flipped_moment_on_rank_1_stops_the_run_in_its_step_with_exit_5(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    cmd = [*torchrun_cmd(2), "-m", "megatron.cli.train", "--config", TINY,
           *sets(f"run.dir={run.path}", *TRAIN)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=clean_env(OMP_NUM_THREADS="1",
                                        **{faults.STATE_FAULT_VAR: "1:3:exp_avg:1e20"}))
    assert proc.returncode != 0 and "(exitcode: 5)" in proc.stderr, proc.stderr[-3000:]
    assert "step 3: the training state broke an invariant" in proc.stderr, proc.stderr[-3000:]
    assert "rank 1 on " in proc.stderr and "Adam moments break m^2 <= C v" in proc.stderr
    records = read_metrics(run.metrics)
    (event,) = events(records, "state_suspect")
    assert (event.step, event.rank, event.known) == (3, 1, True)
    assert run.read_bad_nodes() == [event.host]
    assert sorted(r.step for r in steps(records)) == [1, 2]  # step 3 not logged as trained
    assert run.continuation().found.step == 2  # saved every step: nothing of step 3
