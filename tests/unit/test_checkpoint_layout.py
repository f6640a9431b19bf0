"""The commit protocol on disk (store.py), which checkpoint a run continues from (layout.py), the
run-directory checks (rundir.py). Each test is one way a checkpoint or run directory goes wrong;
a failure names the guarantee that broke: visibility, skipping, refusal, or lock (the lock and
read-only checks that need other processes are tests/integration/test_checkpoint_run_dir.py)."""
import json
import logging
import os

import pytest

from megatron.base import store
from megatron.checkpoint.layout import check_model, find_resume, layout_record
from megatron.base.rundir import check_run_dir
from megatron.config import load_config
from megatron.config.errors import ConfigError, InputError
from megatron.base.records import CheckpointMeta
from tests.support.checkpoints import meta_json


def record(dp=1, **sets):
    cfg = load_config(None, [f"{k}={v}" for k, v in sets.items()])
    return layout_record(cfg, dp, 512, 500)


def committed(ckpt_dir, step, payload=b"weights", layout=None):
    """A complete checkpoint, written through the same staging and rename as a real save."""
    tag = store.tag_for(step)
    staging = store.staging_folder(str(ckpt_dir), tag)
    os.makedirs(os.path.join(staging, store.SHARDS))
    with open(os.path.join(staging, store.SHARDS, "r.pt"), "wb") as f:
        f.write(payload)
    index = json.dumps({"w": {"shape": [len(payload)], "tp": 1, "dim": None, "stride": 1,
                              "pieces": [[f"{store.SHARDS}/r.pt", 0, 0, len(payload)]]}})
    with open(os.path.join(staging, store.INDEX), "w") as f:
        f.write(index)
    files = {f"{store.SHARDS}/r.pt": len(payload), store.INDEX: len(index)}
    store.write_json(os.path.join(staging, store.META),
                     meta_json(step, files, layout or record()))
    store.commit(staging, os.path.join(str(ckpt_dir), tag))
    return os.path.join(str(ckpt_dir), tag)


def cfg_for(run_dir, load="auto"):
    return load_config(None, [f"run.dir={run_dir}", f"training.load={load}"])


def test_a_staged_save_is_invisible_until_committed(tmp_path):
    ckpt = tmp_path / "checkpoints"
    committed(ckpt, 5)
    os.makedirs(store.staging_folder(str(ckpt), "step_0000010"))  # a save killed midway
    resume = find_resume(cfg_for(tmp_path))
    assert resume.step == 5
    assert (ckpt / "latest").read_text() == "step_0000005"


def _index_as(text: str):
    """Overwrites index.json in place with `text`, padded to its size (the size check passes)."""
    def damage(folder):
        path = os.path.join(folder, store.INDEX)
        size = os.path.getsize(path)
        with open(path, "w") as f:
            f.write(text.ljust(size)[:size])
    return damage


@pytest.mark.parametrize("damage, reason", [
    (lambda f: open(os.path.join(f, store.SHARDS, "r.pt"), "wb").write(b"trunc"), "has 5 bytes"),
    # index.json damaged in place, same size: refused by content, the older one resumes
    (_index_as("\x00garbage"), "index.json is not valid JSON"),
    (_index_as("{}"), "index.json is damaged: it holds dict"),
    (_index_as("[1, 2, 3]"), "index.json is damaged: it holds list"),
    (_index_as('{"w": {"shape": [7], "tp": 1, "dim": null, "stride": 1, "pieces": '
               '[["shards/x.pt", 0, 0, 7]]}}'), "a piece of 'w' is"),
    (lambda f: os.remove(os.path.join(f, store.SHARDS, "r.pt")), "is missing"),
    (lambda f: open(os.path.join(f, store.META), "w").write("{garbage"), "not valid JSON"),
    (lambda f: os.remove(os.path.join(f, store.META)), "meta.json is missing"),
])
def test_a_damaged_newer_checkpoint_is_named_and_skipped_never_deleted(tmp_path, caplog, damage,
                                                                         reason):
    ckpt = tmp_path / "checkpoints"
    committed(ckpt, 5)
    newer = committed(ckpt, 10)
    damage(newer)
    with caplog.at_level(logging.WARNING):
        resume = find_resume(cfg_for(tmp_path))
    assert resume.step == 5
    assert newer in caplog.text and reason in caplog.text
    assert os.path.isdir(newer)


@pytest.mark.parametrize("latest", ["", "step_0009999", "\x00garbage"])
def test_the_latest_file_does_not_decide(tmp_path, latest):
    ckpt = tmp_path / "checkpoints"
    committed(ckpt, 5)
    (ckpt / "latest").write_text(latest)
    assert find_resume(cfg_for(tmp_path)).step == 5


def test_only_damaged_checkpoints_is_one_message_not_a_fresh_start(tmp_path):
    ckpt = tmp_path / "checkpoints"
    damaged = committed(ckpt, 5)
    os.remove(os.path.join(damaged, store.SHARDS, "r.pt"))
    with pytest.raises(InputError, match="no complete checkpoint") as e:
        find_resume(cfg_for(tmp_path))
    assert damaged in str(e.value)


def test_auto_without_checkpoints_starts_fresh_and_a_path_without_is_refused(tmp_path):
    assert find_resume(cfg_for(tmp_path)) is None
    with pytest.raises(ConfigError, match="checkpoint.load"):
        find_resume(cfg_for(tmp_path, str(tmp_path / "nothing")))


def test_one_checkpoint_folder_can_be_named(tmp_path):
    ckpt = tmp_path / "checkpoints"
    five = committed(ckpt, 5)
    committed(ckpt, 10)
    assert find_resume(cfg_for(tmp_path, five)).step == 5


def test_the_last_good_checkpoint_is_known_for_messages(tmp_path):
    ckpt = tmp_path / "checkpoints"
    five = committed(ckpt, 5)
    committed(ckpt, 10)
    assert find_resume(cfg_for(tmp_path)).last_good == five


def test_an_old_deepspeed_checkpoint_says_how_to_continue(tmp_path, caplog):
    folder = tmp_path / "checkpoints" / "step_0000004"
    folder.mkdir(parents=True)
    (folder / "mp_rank_00_model_states.pt").write_bytes(b"x")
    with pytest.raises(InputError, match="older version of this project") as e:
        find_resume(cfg_for(tmp_path))
    assert "init_from" in str(e.value)


def test_another_model_is_refused_field_by_field_any_layout_is_not(tmp_path):
    folder = committed(tmp_path / "checkpoints", 4, layout=record(2, **{
        "parallel.tensor_parallel_size": 2}))
    resume = find_resume(cfg_for(tmp_path))
    check_model(resume, record(1, **{"parallel.pipeline_parallel_size": 2,
                                     "parallel.zero_stage": 3}))
    with pytest.raises(InputError, match="holds another model") as e:
        check_model(resume, record(1, **{"model.num_layers": 3, "model.activation": "swiglu"}))
    assert "model.num_layers: checkpoint 2, this run 3" in str(e.value)
    assert "model.activation: checkpoint 'gelu', this run 'swiglu'" in str(e.value)
    assert folder in str(e.value)


def test_the_number_of_experts_is_part_of_the_model_and_old_records_are_dense(tmp_path):
    """MoE fields are recorded only for MoE models: a dense record (or one written before the
    fields existed) has none and means the dense defaults; another expert count is refused."""
    dense = record(1)
    assert "num_experts" not in dense.model and "moe_layer_freq" not in dense.model
    folder = committed(tmp_path / "checkpoints", 4, layout=record(4, **{
        "model.moe.num_experts": 4, "parallel.expert_parallel_size": 4}))
    resume = find_resume(cfg_for(tmp_path))
    check_model(resume, record(2, **{"model.moe.num_experts": 4}))  # any EP size
    with pytest.raises(InputError, match="holds another model") as e:
        check_model(resume, record(1, **{"model.moe.num_experts": 8}))
    assert "model.moe.num_experts: checkpoint 4, this run 8" in str(e.value) and folder in str(e.value)
    with pytest.raises(InputError, match="model.moe.num_experts: checkpoint 4, this run 0"):
        check_model(resume, dense)
    old = committed(tmp_path / "old" / "checkpoints", 3, layout=dense)
    check_model(find_resume(cfg_for(tmp_path / "old")), record(2))
    with pytest.raises(InputError, match="model.moe.num_experts: checkpoint 0, this run 4"):
        check_model(find_resume(cfg_for(tmp_path / "old")), record(1, **{"model.moe.num_experts": 4}))
    assert old


def test_keep_last_removes_only_older_complete_checkpoints(tmp_path):
    ckpt = tmp_path / "checkpoints"
    folders = [committed(ckpt, s) for s in (1, 2, 3, 4)]
    os.remove(os.path.join(folders[0], store.META))  # damaged: left for a person
    removed = store.prune(str(ckpt), 2)
    assert removed == [folders[1]]
    assert [os.path.isdir(f) for f in folders] == [True, False, True, True]


def test_a_rollback_moves_every_folder_above_its_step_and_repoints_latest(tmp_path):
    """store.set_aside_above (checkpoint.roll_back): complete or not, each step_N folder above
    the step is renamed into the new folder whole; `latest` names the newest complete one left,
    and goes when none is left."""
    ckpt, dest = tmp_path / "checkpoints", tmp_path / "rolled_back" / "a"
    folders = [committed(ckpt, s, payload=b"w%d" % s) for s in (1, 2, 3, 4)]
    os.remove(os.path.join(folders[2], store.META))  # step 3 damaged: moved all the same
    moved = store.set_aside_above(str(ckpt), 2, str(dest))
    assert moved == [folders[3], folders[2]]
    assert sorted(os.listdir(ckpt)) == ["latest", "step_0000001", "step_0000002"]
    assert (ckpt / "latest").read_text() == "step_0000002"
    assert sorted(os.listdir(dest)) == ["step_0000003", "step_0000004"]
    assert (dest / "step_0000004" / "shards" / "r.pt").read_bytes() == b"w4"
    assert store.validate(str(dest / "step_0000004")).step == 4
    assert store.set_aside_above(str(ckpt), 2, str(tmp_path / "b")) == []  # nothing above
    assert not (tmp_path / "b").exists()
    assert len(store.set_aside_above(str(ckpt), 0, str(tmp_path / "c"))) == 2
    assert os.listdir(ckpt) == []  # no checkpoint left: no pointer either


def test_run_dir_that_is_a_file_or_under_a_file(tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    with pytest.raises(InputError, match="is a file, not a directory"):
        check_run_dir(str(a_file))
    with pytest.raises(InputError, match="lies inside the file .*, where a directory is needed"):
        check_run_dir(str(a_file / "run"))


def test_a_save_over_a_skipped_folder_of_the_same_step_keeps_both(tmp_path):
    """Resume skipped a damaged step_10 and trained to step 10 again: the new save commits and
    the damaged folder is set aside (never deleted, never read)."""
    from megatron.checkpoint.sharded import _commit
    ckpt = tmp_path / "checkpoints"
    damaged = committed(ckpt, 10)
    os.remove(os.path.join(damaged, store.META))
    staging = store.staging_folder(str(ckpt), "step_0000010")
    os.makedirs(os.path.join(staging, store.SHARDS))
    open(os.path.join(staging, "shards", "x.pt"), "wb").close()
    described = {"w": {"shape": [0], "dim": None, "stride": 1,
                       "pieces": [["shards/x.pt", 0, 0, 0]]}}
    status, _ = _commit(staging, damaged, [(None, "shards/x.pt", 0, described)],
                        CheckpointMeta.from_json(meta_json(10, {}, record())), 0, str(ckpt))
    assert status == "ok"
    assert store.validate(damaged).step == 10
    assert any(".superseded-" in n for n in os.listdir(ckpt))


def test_a_checkpoint_folder_that_vanishes_while_listed_counts_as_empty(tmp_path, monkeypatch):
    """Rank 0's start-up storage probe makes the checkpoint folder and removes it again when it
    made it (training/checkpointer.probe_storage): a process listing it meanwhile (a resume
    look-up, a test polling for the first save) saw it exist, then had os.listdir raise. The
    listings (committed, leftovers, finish_deletions) take a folder gone, missing or a file as
    empty. Measured: the e2e kill test's poll failed so once in CI."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    real = os.listdir

    def gone(path):  # the folder removed between any look and the listing
        if str(path) == str(folder):
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real(path)
    monkeypatch.setattr(os, "listdir", gone)
    assert store.committed(str(folder)) == []
    assert store.leftovers(str(folder)) == []
    assert store.finish_deletions(str(folder)) == []
    monkeypatch.setattr(os, "listdir", real)
    (tmp_path / "a-file").write_text("x")
    for path in (tmp_path / "missing", tmp_path / "a-file"):
        assert store.committed(str(path)) == [] and store.leftovers(str(path)) == []
