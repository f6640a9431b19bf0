"""A resume that would continue at a data position of another sample stream is refused, naming
the field with its old and new values; training.new_data_stream=true keeps the checkpoint's
weights, optimizer and step and starts the new stream at its first sample. (Issue 21 item 2:
model.seq_length 64 -> 32 from the run's own config.yaml used to resume silently, counting
consumed_samples in samples of another length.)"""
import pytest

from megatron.base.records import read_metrics, steps
from megatron.base.rundir import RunDir
from tests.support.cli import assert_clean_error, clean_env, run_cli, sets
from tests.support.paths import TINY

FAST = ["training.train_iters=4", "training.tensorboard=false", "training.global_batch_size=4",
        "training.micro_batch_size=2", "model.num_layers=2"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    run = tmp_path_factory.mktemp("stream") / "run"
    proc = run_cli(["--config", TINY, *sets(f"run.dir={run}", "training.exit_interval=2",
                                           *FAST)], clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


@pytest.mark.parametrize("change, words", [
    ("model.seq_length=32", "model.seq_length: checkpoint 64, this run 32"),
    ("data.seed=7", "data.seed: checkpoint 1234, this run 7"),
    ("data.split=90,5,5", "data.split: checkpoint '969,30,1', this run '90,5,5'"),
])
def test_another_sample_stream_is_refused_naming_the_field(saved, change, words):
    proc = run_cli(["--config", str(saved / "config.yaml"),
                    *sets("training.load=auto", change)], clean_env())
    assert_clean_error(proc, "another sample stream", words, "checkpoint.new_data_stream=true")
    assert proc.returncode == 2


def test_new_data_stream_resumes_weights_and_step_and_restarts_the_stream(saved, tmp_path):
    import shutil
    run = tmp_path / "run"
    shutil.copytree(saved, run)
    proc = run_cli(["--config", str(run / "config.yaml"), *sets(
        f"run.dir={run}", "training.load=auto", "model.seq_length=32",
        "training.new_data_stream=true")], clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "new sample stream starts at its first sample" in proc.stderr
    assert [r.step for r in steps(read_metrics(RunDir(str(run)).metrics))] == [1, 2, 3, 4]


@pytest.mark.parametrize("gbs", [8, 2])
def test_another_global_batch_size_says_where_the_data_continues(saved, tmp_path, gbs):
    """Issue 40 item 11b: 2 steps of 4 samples, then global_batch_size 8 (or 2): one line says
    the 8 samples consumed, that the data continues at sample 8 in steps of the new size, and
    the 2 steps left; a batch_size event records it, and the last checkpoint counts 8 + 2 x gbs
    samples."""
    import shutil
    from megatron.base.records import events
    from megatron.base.store import validate
    run = tmp_path / "run"
    shutil.copytree(saved, run)
    proc = run_cli(["--config", str(run / "config.yaml"), *sets(
        f"run.dir={run}", "checkpoint.load=auto", f"training.global_batch_size={gbs}",
        "training.exit_interval=0", "checkpoint.save=true")], clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stderr.splitlines() if "global_batch_size changed" in ln]
    assert len(line) == 1, proc.stderr[-3000:]
    for part in (f"{gbs} now, the checkpoint's was 4", "consumed 8 samples in 2 steps",
                 f"the data continues at sample 8, {gbs} samples a step",
                 f"steps 3 to 4 of training.train_iters=4 (2 steps) take {2 * gbs} samples"):
        assert part in line[0], line[0]
    (event,) = events(read_metrics(RunDir(str(run)).metrics), "batch_size")
    assert (event.step, event.consumed_samples, event.before, event.global_batch_size,
            event.steps_left, event.samples_left) == (2, 8, 4, gbs, 2, 2 * gbs)
    assert validate(str(run / "checkpoints" / "step_0000004")).consumed_samples == 8 + 2 * gbs
