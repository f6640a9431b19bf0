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


@pytest.mark.parametrize("change, changed, hint", [
    (["training.train_iters=8"], "decay_iters 4 -> 8", "set optimizer.lr_decay_iters=4"),
    (["training.train_iters=8", "optimizer.lr_decay_iters=4"], None, None),
    (["optimizer.lr=0.001"], "lr 0.003 -> 0.001", None),
    # a cosine run continued as warm-up, stable, decay over its last 2 of 8 steps: the config
    # and the checkpoint's record carry wsd's settings through a resume
    (["training.train_iters=8", "optimizer.lr_decay_style=wsd", "optimizer.lr_wsd_decay_iters=2"],
     "decay_style cosine -> wsd; decay_iters 4 -> 8; wsd_decay_iters None -> 2", None),
])
def test_a_changed_learning_rate_schedule_is_named_with_the_rate_it_jumps_to(
        saved, tmp_path, change, changed, hint):
    """The schedule is read by step, so a resume that moves its end (training.train_iters with
    optimizer.lr_decay_iters unset: training longer) or its peak reads it at the checkpoint's
    step under the new settings: one warning with both rates and, for the first, the setting
    that keeps the checkpoint's schedule; an lr_schedule event; the next step's rate is the one
    named. Setting that fix resumes on the checkpoint's schedule, silently."""
    import shutil
    from megatron.base.records import events
    run = tmp_path / "run"
    shutil.copytree(saved, run)
    proc = run_cli(["--config", str(run / "config.yaml"), *sets(
        f"run.dir={run}", "checkpoint.load=auto", "training.exit_interval=0", *change)],
        clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if "learning-rate schedule changed" in ln]
    records = read_metrics(RunDir(str(run)).metrics)
    found = events(records, "lr_schedule")
    if changed is None:
        assert not lines and not found, proc.stderr[-3000:]
        return
    (event,) = found
    assert len(lines) == 1 and event.step == 2 and event.changed == changed
    assert ("lr_decay_iters=" in lines[0]) == (hint is not None) and (hint or "") in lines[0]
    step3 = next(r for r in steps(records) if r.step == 3)
    assert step3.lr == pytest.approx(event.lr_after)
    # at step 3, the warm-up's end, a moved decay end still gives the peak: named as the same
    same = event.lr_after == pytest.approx(event.lr_before)
    assert same == ("under both, and the two part after it" in lines[0]), lines[0]
    assert same == ("decay_iters" in changed)


def test_a_resume_with_no_step_left_says_so_and_names_no_schedule_change(saved, tmp_path):
    """training.train_iters at or below the checkpoint's step: nothing is trained, and the log
    says why (it said "final loss nan"); the schedule, moved with train_iters, is not judged."""
    import shutil
    run = tmp_path / "run"
    shutil.copytree(saved, run)
    proc = run_cli(["--config", str(run / "config.yaml"), *sets(
        f"run.dir={run}", "checkpoint.load=auto", "training.train_iters=2")], clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "nothing left to train: the checkpoint is at step 2 and training.train_iters=2" \
        in proc.stderr and "final loss n/a (no step trained)" in proc.stderr
    assert "schedule changed" not in proc.stderr and "nan" not in proc.stderr
