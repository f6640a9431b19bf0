"""A resume with another training.global_batch_size says what happens to the data position
(issue 40 item 11b): one line with the samples consumed, where the data continues (in samples)
and the steps left with the samples they take, and a batch_size event in metrics.jsonl; the
real-data index is sized for what the run reads, so a smaller batch never wraps to the start.
The same resume through megatron-train is tests/integration/test_checkpoint_data_stream.py."""
import dataclasses

from megatron.base.records import BatchSizeEvent, CheckpointMeta, record_json
from megatron.config.sections import TrainingConfig
from megatron.data import gpt_dataset
from megatron.data import build_iterators
from megatron.training.checkpointer import batch_size_change
from tests.support.checkpoints import DATA, meta_json
from tests.support.data import write_tokens


def _t(gbs, train_iters):
    return TrainingConfig(global_batch_size=gbs, train_iters=train_iters)


def _meta(step, consumed, gbs):
    meta = CheckpointMeta.from_json(meta_json(step, {}))
    return dataclasses.replace(meta, consumed_samples=consumed,
                               data=dataclasses.replace(DATA, global_batch_size=gbs))


def test_the_same_batch_size_says_nothing():
    assert batch_size_change(_meta(8, 64, 8), _t(8, 20)) is None
    assert batch_size_change(_meta(8, 64, None), _t(8, 20)) is None  # older record, consistent


def test_a_larger_batch_states_the_position_and_the_steps_left():
    event, text = batch_size_change(_meta(8, 64, 8), _t(16, 20))
    assert event == BatchSizeEvent(step=8, consumed_samples=64, before=8, global_batch_size=16,
                                   steps_left=12, samples_left=192)
    assert record_json(event)["event"] == "batch_size"
    for part in ("training.global_batch_size changed on resume: 16 now, the checkpoint's was 8",
                 "consumed 64 samples in 8 steps", "the data continues at sample 64, 16 "
                 "samples a step, none skipped or repeated", "steps 9 to 20 of "
                 "training.train_iters=20 (12 steps) take 192 samples (at the checkpoint's "
                 "batch size: 96), samples 64 to 255"):
        assert part in text, text
    assert "\n" not in text


def test_a_checkpoint_without_its_batch_size_is_judged_by_its_consumed_samples():
    event, text = batch_size_change(_meta(8, 64, None), _t(4, 10))
    assert event.before is None and event.samples_left == 8
    assert "the checkpoint's was not recorded in it" in text, text


def test_a_smaller_batch_sizes_the_training_index_for_what_the_run_reads(tmp_path, monkeypatch):
    """16 samples a step for 10 steps, then 8 a step: steps 11-20 read samples 160-239, past the
    160 that train_iters x global_batch_size would size the index for."""
    from megatron.config import load_config
    prefix = str(tmp_path / "c")
    write_tokens(prefix, [[1000 * i + j for j in range(30)] for i in range(40)])
    sets = {"data.synthetic": "false", "data.paths": f'["{prefix}"]',
            "data.cache_dir": str(tmp_path / "cache"), "model.vocab_size": "65536",
            "model.seq_length": "16", "training.micro_batch_size": "2",
            "training.global_batch_size": "8", "training.train_iters": "20",
            "eval.eval_iters": "1"}
    built = {}
    real = gpt_dataset.build_split

    def build_split(split, *a, num_samples, **k):
        ds = real(split, *a, num_samples=num_samples, **k)
        built[split] = (num_samples, len(ds) if ds is not None else 0)
        return ds
    monkeypatch.setattr(gpt_dataset, "build_split", build_split)
    build_iterators(load_config(None, [f"{k}={v}" for k, v in sets.items()]), 0, 1, 160,
                    step=10)
    asked, holds = built["train"]
    assert asked == 240 and holds >= 240, built
