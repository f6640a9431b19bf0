"""training.rampup_batch_size (Megatron-LM's --rampup-batch-size): each step's global batch from
the samples consumed before it, checked against hand counts; the refusals, each naming the field
and the fix; the data iterators' steps of ramp-sized batches; the metrics line's batch; the run's
length in samples (training.train_samples, Megatron-LM's --train-samples) counted in the ramp's
steps."""
import json

import numpy as np
import pytest

from megatron.base.records import parse_metrics_line, record_json
from megatron.config import ConfigError, load_config, validate_for_world
from megatron.data.iterators import micro_batches
from megatron.training.log_line import LogLines
from tests.support.metrics import step_record

TINY = "examples/local/tiny.yaml"


def training(*sets):
    return load_config(TINY, list(sets)).training


def test_the_batch_grows_by_the_increment_every_share_of_the_ramp_samples():
    """[16, 16, 300] to 64: three increments, one every 100 samples consumed."""
    t = training("training.global_batch_size=64", "training.rampup_batch_size=[16, 16, 300]")
    by_hand = {0: 16, 99: 16, 100: 32, 199: 32, 200: 48, 299: 48, 300: 64, 10 ** 9: 64}
    assert {c: t.global_batch_at(c) for c in by_hand} == by_hand
    assert t.ramp_sizes() == [16, 32, 48, 64]
    assert training("training.global_batch_size=64").global_batch_at(0) == 64


def test_bloom_176b_ramp_by_hand():
    """BLOOM-176B's [192, 16, 9765625] to 2048: 116 increments, one every 84,186.4 samples."""
    t = training("training.global_batch_size=2048",
                 "training.rampup_batch_size=[192, 16, 9765625]")
    per = 9765625 / 116
    assert t.global_batch_at(84186) == 192 and t.global_batch_at(84187) == 208
    assert t.global_batch_at(int(50 * per) + 1) == 192 + 50 * 16
    assert t.global_batch_at(9765624) == 2032 and t.global_batch_at(9765625) == 2048
    assert len(t.ramp_sizes()) == 117


def steps_taken(t, consumed, count, dp=2, mb=2, rank_count=2):
    """The sample ids of `count` steps from `consumed`, per step, over every DP rank."""
    sample = lambda i: np.full(3, i, dtype=np.int64)  # noqa: E731 (sample i is all i)
    its = [micro_batches(sample, 10 ** 6, consumed, mb, t.global_batch_size, r, dp,
                         batch_at=t.global_batch_at) for r in range(rank_count)]
    out = []
    for _ in range(count):
        batch = t.global_batch_at(consumed)
        ids = [int(v) for it in its for _ in range(batch // (mb * dp)) for v in next(it)[0][:, 0]]
        out.append(sorted(ids))
        consumed += batch
    return out


def test_each_step_takes_the_ramp_batch_of_the_samples_after_the_last():
    """Under a ramp the union over DP ranks of a step is [consumed, consumed + batch), and an
    iterator started at a consumed count mid-ramp (a resume) yields the same steps. [4, 4, 24]
    to 16: three increments, one every 8 samples consumed."""
    t = training("training.global_batch_size=16", "training.micro_batch_size=2",
                 "training.rampup_batch_size=[4, 4, 24]")
    got = steps_taken(t, 0, 6)
    assert [len(s) for s in got] == [4, 4, 8, 12, 16, 16]
    assert got == [list(range(a, a + n)) for a, n in ((0, 4), (4, 4), (8, 8), (16, 12),
                                                      (28, 16), (44, 16))]
    assert steps_taken(t, 16, 3) == got[3:]


@pytest.mark.parametrize("ramp, words", [
    ("[16, 16]", "three positive integers"),
    ("[16, 0, 100]", "three positive integers"),
    ("[64, 16, 100]", "a start below training.global_batch_size=64"),
    ("[16, 20, 100]", "an increment that reaches it"),
    ("[a, 16, 100]", "a list of integers"),
])
def test_a_malformed_ramp_is_refused_naming_it(ramp, words):
    with pytest.raises(ConfigError) as e:
        training("training.global_batch_size=64", f"training.rampup_batch_size={ramp}")
    assert e.value.field == "training.rampup_batch_size" and words in str(e.value)


def test_a_ramp_batch_that_is_not_whole_micro_batches_on_every_rank_is_refused():
    cfg = load_config(TINY, ["training.global_batch_size=64", "training.micro_batch_size=2",
                             "training.rampup_batch_size=[18, 2, 100]"])
    with pytest.raises(ConfigError) as e:
        validate_for_world(cfg, 4)
    assert e.value.field == "training.rampup_batch_size"
    assert "multiples of micro_batch_size x data-parallel size (2 x 4 = 8)" in str(e.value)
    cfg = load_config(TINY, ["training.global_batch_size=64", "training.micro_batch_size=2",
                             "training.rampup_batch_size=[16, 8, 100]"])
    assert validate_for_world(cfg, 4) == 4


def test_an_interleaved_pipeline_refuses_a_ramp_batch_it_cannot_group():
    """24 samples on 4 DP ranks of micro-batch 2 are 3 micro-batches: not a multiple of the 2
    stages the interleaved order groups them by."""
    sets = ["training.global_batch_size=64", "training.micro_batch_size=2",
            "parallel.pipeline_parallel_size=2", "parallel.pipeline_schedule=interleaved",
            "parallel.virtual_pipeline_size=2", "model.num_layers=4", "parallel.zero_stage=1"]
    cfg = load_config(TINY, sets + ["training.rampup_batch_size=[16, 8, 100]"])
    with pytest.raises(ConfigError) as e:
        validate_for_world(cfg, 8)
    assert e.value.field == "training.rampup_batch_size" and "at 24 samples" in str(e.value)
    assert "multiples of micro_batch_size x data-parallel size x pipeline_parallel_size = 16" \
        in str(e.value)
    cfg = load_config(TINY, sets + ["training.rampup_batch_size=[16, 16, 100]"])
    assert validate_for_world(cfg, 8) == 4


def test_the_step_line_carries_the_batch_only_under_a_ramp():
    plain = step_record(3)
    ramped = step_record(3, global_batch_size=24)
    assert "global_batch_size" not in record_json(plain)
    line = json.loads(json.dumps(record_json(ramped)))
    assert parse_metrics_line(line).global_batch_size == 24
    assert LogLines(10).line(ramped).endswith("| batch 24")
    assert "batch" not in LogLines(10).line(plain)


def test_a_run_config_written_with_a_ramp_reads_back_the_same(tmp_path):
    """A run's config.yaml (what a resume reads) keeps the ramp's three integers."""
    cfg = load_config(TINY, ["training.global_batch_size=16",
                             "training.rampup_batch_size=[4, 4, 100]"])
    path = tmp_path / "config.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(str(path)).training.rampup_batch_size == [4, 4, 100]


def test_the_eta_inside_a_ramp_takes_the_step_scaled_to_the_whole_batch():
    """A step of 24 samples in 2 s with 8 steps left to a batch of 96: 8 x 2 x 96/24 = 64 s
    (the steps' average alone said 16 s); at the whole batch the average again."""
    lines = LogLines(total=10, started=0.0, full_batch=96)
    assert "ETA 0:01:04" in lines.step_line(step_record(2, step_time_s=2.0, global_batch_size=24),
                                         now=10.0)
    lines = LogLines(total=10, started=0.0, full_batch=96)
    assert "ETA 0:00:16" in lines.step_line(step_record(2, step_time_s=2.0, global_batch_size=96),
                                         now=10.0)


def test_the_samples_of_the_steps_left_follow_the_ramp():
    """[4, 4, 28] to 8: 7 steps of 4, then 8 each. From sample 20, 5 steps take 4 + 4 + 8 x 3."""
    t = training("training.global_batch_size=8", "training.rampup_batch_size=[4, 4, 28]")
    assert t.samples_over(0, 10) == 7 * 4 + 3 * 8
    assert t.samples_over(20, 5) == 4 + 4 + 3 * 8
    assert t.samples_over(28, 2) == 16 and t.samples_over(0, 0) == 0
    assert training("training.global_batch_size=8").samples_over(20, 5) == 40


def _meta(step, consumed, gbs, ramp):
    import dataclasses
    from megatron.base.records import CheckpointMeta
    from tests.support.checkpoints import DATA, meta_json
    meta = CheckpointMeta.from_json(meta_json(step, {}))
    return dataclasses.replace(meta, consumed_samples=consumed, data=dataclasses.replace(
        DATA, global_batch_size=gbs, rampup_batch_size=ramp))


def test_a_resume_with_another_ramp_says_where_the_data_continues():
    """A checkpoint at step 5 (20 samples) of the ramp [4, 4, 28] to 8: resumed with the same
    ramp, nothing to say; without it, one line and an event with the samples the 5 steps left
    take (40 now, 32 on the checkpoint's ramp); a ramp added to a plain run's checkpoint
    continues on the ramp from the samples consumed."""
    from megatron.base.records import BatchSizeEvent
    from megatron.training.checkpointer import batch_size_change
    ramp = ["training.global_batch_size=8", "training.train_iters=10"]
    same = training(*ramp, "training.rampup_batch_size=[4, 4, 28]")
    assert batch_size_change(_meta(5, 20, 8, [4, 4, 28]), same) is None
    event, text = batch_size_change(_meta(5, 20, 8, [4, 4, 28]), training(*ramp))
    assert event == BatchSizeEvent(5, 20, 8, 8, 5, 40, ramp_before=[4, 4, 28], ramp=None)
    for part in ("training.rampup_batch_size changed on resume: 8 now, the checkpoint's was 8 "
                 "after the ramp [4, 4, 28]", "the data continues at sample 20, 8 samples a "
                 "step", "(5 steps) take 40 samples (at the checkpoint's batch size: 32), "
                 "samples 20 to 59"):
        assert part in text, text
    event, text = batch_size_change(_meta(5, 20, 8, None), same)
    assert (event.samples_left, event.ramp_before, event.ramp) == (32, None, [4, 4, 28])
    assert "the data continues at sample 20, 4 samples a step on the ramp to 8" in text, text
    assert "(at the checkpoint's batch size: 40)" in text, text


def test_a_checkpoint_records_its_ramp_and_only_when_there_is_one():
    import dataclasses
    from megatron.base.records import CheckpointMeta
    plain, ramped = _meta(5, 20, 8, None), _meta(5, 20, 8, [4, 4, 28])
    assert "rampup_batch_size" not in plain.to_json()["data"]  # older versions read it
    again = CheckpointMeta.from_json(json.loads(json.dumps(ramped.to_json())))
    assert again.data.rampup_batch_size == [4, 4, 28]
    assert dataclasses.replace(again, saved_at=ramped.saved_at) == ramped


@pytest.mark.parametrize("samples, ramp, steps", [
    (48, [4, 4, 24], 9),   # six steps of 4 reach 24, then three of 8 reach 48 exactly
    (49, [4, 4, 24], 10),  # one sample more takes a whole step more
    (10, [4, 4, 24], 3),   # inside the ramp: 4 + 4 + 4
    (17, None, 3),         # no ramp: ceil(17 / 8)
    (8, None, 1),
])
def test_train_samples_sets_the_steps_that_hold_them(samples, ramp, steps):
    sets = ["training.global_batch_size=8", "training.train_iters=null",
            f"training.train_samples={samples}"]
    if ramp:
        sets.append(f"training.rampup_batch_size={ramp}")
    t = training(*sets)
    assert t.train_iters == steps
    assert t.samples_over(0, steps) >= samples > t.samples_over(0, steps - 1)
    assert t.total_samples() == samples


def test_a_config_written_with_train_samples_reads_back_and_both_lengths_are_refused(tmp_path):
    """A run's config.yaml says the length once, in samples, so a resume with another batch
    re-counts the steps; a file's train_iters and a --set train_samples are refused together
    (Megatron-LM's rule: one of the two); nothing set: 20 steps."""
    cfg = load_config(TINY, ["training.global_batch_size=16", "training.train_iters=null",
                             "training.train_samples=100",
                             "training.rampup_batch_size=[4, 4, 100]"])
    path = tmp_path / "config.yaml"
    path.write_text(cfg.to_yaml())
    again = load_config(str(path)).training
    # steps of 4 to 36 samples, of 8 to 68, of 12 to 104: 9 + 4 + 3
    assert (again.train_samples, again.train_iters) == (100, cfg.training.train_iters) == (100, 16)
    # to a batch of 8 the ramp's one increment comes at sample 100: 25 steps of 4
    assert load_config(str(path), ["training.global_batch_size=8"]).training.train_iters == 25
    assert load_config(None).training.train_iters == 20
    with pytest.raises(ConfigError, match="training.train_iters=20 is set .100 samples take 16 "
                                          "steps here.; set the run's length once"):
        load_config(TINY, ["training.global_batch_size=16", "training.train_samples=100",
                           "training.rampup_batch_size=[4, 4, 100]"])
