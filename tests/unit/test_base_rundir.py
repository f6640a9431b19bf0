"""RunDir gives one answer to "which checkpoint continues this run", and every reader of a run
directory gets the same one: resume (checkpoint.layout.find_resume), conversion
(convert.checkpoint_folder), the job chain (training.chain.progress) and the rollback
(training.checkpointer.Checkpointer.last_good asks continuation() too)."""
import json
import logging
import os

import pytest

from megatron.base import store
from megatron.checkpoint.convert import checkpoint_folder
from megatron.checkpoint.layout import find_resume
from megatron.base.rundir import RunDir
from megatron.config import load_config
from megatron.config.errors import InputError
from megatron.training.chain import progress
from tests.support.checkpoints import meta_json


def _commit(run: RunDir, step: int, damaged: bool = False) -> str:
    tag = store.tag_for(step)
    staging = store.staging_folder(run.checkpoints, tag)
    os.makedirs(os.path.join(staging, store.SHARDS))
    with open(os.path.join(staging, store.SHARDS, "a.pt"), "wb") as f:
        f.write(b"ab" if damaged else b"abc")
    store.write_json(os.path.join(staging, store.META), meta_json(step, {"shards/a.pt": 3}))
    final = os.path.join(run.checkpoints, tag)
    store.commit(staging, final)
    return final


def test_one_answer_found_skipped_last_good_and_leftovers(tmp_path, caplog):
    run = RunDir(str(tmp_path))
    _commit(run, 2)
    good = _commit(run, 4)
    broken = _commit(run, 6, damaged=True)
    (tmp_path / "checkpoints" / ".staging-step_0000008").mkdir()
    c = run.continuation()
    assert c.found.folder == good and c.step == 4 and c.found.meta.step == 4
    assert c.last_good.endswith("step_0000002")
    assert len(c.skipped) == 1 and broken in c.skipped[0] and "has 2 bytes" in c.skipped[0]
    assert c.leftovers[0].endswith(".staging-step_0000008")
    with caplog.at_level(logging.WARNING):
        c.warn()
    assert broken in caplog.text and "never committed" in caplog.text
    # every reader of the run directory agrees
    cfg = load_config(None, [f"run.dir={tmp_path}", "training.load=auto"])
    assert find_resume(cfg).folder == good
    assert checkpoint_folder(str(tmp_path)) == good
    assert progress(str(tmp_path), 10).step == 4 and progress(str(tmp_path), 10).skipped


def test_no_checkpoint_and_only_broken_ones_are_told_apart(tmp_path):
    run = RunDir(str(tmp_path))
    assert run.continuation().found is None and run.continuation().step == 0
    with pytest.raises(InputError, match="no complete checkpoint"):
        run.checkpoint()
    _commit(run, 3, damaged=True)
    with pytest.raises(InputError, match="has 2 bytes"):
        run.checkpoint()


def test_a_missing_tag_names_the_tags_there(tmp_path):
    run = RunDir(str(tmp_path))
    _commit(run, 5)
    with pytest.raises(InputError, match="step_0000005"):
        run.checkpoint("step_0000009")


def test_require_names_what_a_run_directory_holds(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        RunDir(str(tmp_path / "nope")).require()
    (tmp_path / "notes").write_text("")
    with pytest.raises(InputError, match="run directory '.*/notes' is a file; pass a directory"):
        RunDir(str(tmp_path / "notes")).require()
    with pytest.raises(InputError, match="config.yaml.* is missing"):
        RunDir(str(tmp_path)).require()


def test_run_files_are_replaced_whole(tmp_path):
    run = RunDir(str(tmp_path))
    run.write_run_files("model: {}\n", json.dumps({"train_batch_size": 8}))
    assert open(run.config).read() == "model: {}\n"
    assert json.load(open(run.deepspeed_json)) == {"train_batch_size": 8}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "deepspeed.json"]
