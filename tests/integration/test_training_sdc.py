"""Silent data errors told apart from loss spikes (issue 20 item 6, training.rerun_suspect_steps).
Two ranks train at a learning rate high enough to wobble, with a spike factor so low that
ordinary step-to-step wobble counts as a spike: each of those is computed again, comes out the
same, and is logged as a spike, and the run's losses stay an unchecked run's exactly. At step 15 the test hook MEGATRON_TEST_CORRUPT scales
rank 1's losses (and so its gradients) once, as a faulty unit would: the recomputation differs
on rank 1 only, which is named ({"event": "sdc_suspect"}) with its node in bad_nodes; the step's
update is not applied, nothing is saved after it, and the run exits 5."""
import subprocess

import pytest

from megatron.base.records import events, read_metrics, steps
from megatron.base.rundir import RunDir
from tests.support.cli import clean_env, sets
from tests.support.paths import ROOT, TINY
from tests.support.procs import torchrun_cmd

pytestmark = pytest.mark.slow  # two torchrun launches of two ranks: about 70 s

TRAIN = ("training.train_iters=20", "training.save_interval=5", "training.tensorboard=false",
         "training.global_batch_size=8", "model.num_layers=2", "optimizer.lr=0.05")


def _torchrun(run_dir, *extra, **env):
    cmd = [*torchrun_cmd(2), "-m", "megatron.cli.train", "--config", TINY,
           *sets(f"run.dir={run_dir}", *TRAIN, *extra)]
    return subprocess.run(cmd, cwd=ROOT, env=clean_env(OMP_NUM_THREADS="1", **env),
                          capture_output=True, text=True, timeout=300)


def test_a_corrupted_rank_is_named_and_real_spikes_are_not(tmp_path):
    ref, run = RunDir(str(tmp_path / "ref")), RunDir(str(tmp_path / "run"))
    plain = _torchrun(ref.path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    checked = _torchrun(run.path, "training.rerun_suspect_steps=true",
                        "training.loss_spike_factor=1.0001", "training.loss_spike_window=10",
                        MEGATRON_TEST_CORRUPT="1:15:1000")
    assert checked.returncode != 0 and "(exitcode: 5)" in checked.stderr, checked.stderr[-3000:]
    assert "step 15: a suspect loss was computed again" in checked.stderr
    assert "rank 1 on " in checked.stderr and "a silent data error" in checked.stderr
    records = read_metrics(run.metrics)
    spikes = [e.step for e in events(records, "spike")]
    assert spikes and max(spikes) < 15, spikes  # wobble: real spikes, computed again alike
    (sdc,) = events(records, "sdc_suspect")
    assert (sdc.step, sdc.rank) == (15, 1) and sdc.first == pytest.approx(1000 * sdc.again)
    assert run.read_bad_nodes() == [sdc.host]
    got = {r.step: r.loss for r in steps(records)}
    want = {r.step: r.loss for r in steps(read_metrics(ref.metrics))}
    assert sorted(got) == list(range(1, 15))  # step 15 withheld, not logged as trained
    for step in got:
        assert got[step] == want[step], (step, got[step], want[step])  # bitwise: same updates
    assert run.continuation().found.step == 10
