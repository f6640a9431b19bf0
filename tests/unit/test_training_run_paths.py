"""training/run_paths.py: every path a run reads or writes is checked at start-up, before the
process group or the model (issue 41 item 8), not at the first save. These run as root, which
passes every permission bit, so a folder that cannot be written is a file where a directory is
expected, a path inside a regular file, or an immutable folder (chattr +i, set here through its
ioctl). A failure names the path kind that slipped through."""
import array
import fcntl
import os
import time
from contextlib import contextmanager

import pytest

from megatron.config import load_config
from megatron.config.errors import InputError
from megatron.training import startup
from megatron.training.run_paths import check_run_paths

from tests.support.paths import TINY

FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_IMMUTABLE_FL = 0x80086601, 0x40086602, 0x10


def _cfg(tmp_path, *sets):
    return load_config(TINY, [f"run.dir={tmp_path / 'run'}", *sets])


def _refused(cfg, *fragments):
    started = time.monotonic()
    with pytest.raises(InputError) as e:
        startup._check_before_joining(cfg, 1, "cpu")  # what start() runs before joining
    assert time.monotonic() - started < 0.5
    for fragment in fragments:
        assert fragment in str(e.value), (fragment, str(e.value))
    return str(e.value)


def _flags(path, set_to=None):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        buf = array.array("l", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf, True)
        if set_to is not None:
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, array.array("l", [set_to(buf[0])]), True)
        return buf[0]
    finally:
        os.close(fd)


@contextmanager
def immutable(path):
    try:
        _flags(path, lambda f: f | FS_IMMUTABLE_FL)
    except OSError as e:
        pytest.skip(f"cannot make {path} immutable here (chattr +i: {e.strerror})")
    try:
        yield
    finally:
        _flags(path, lambda f: f & ~FS_IMMUTABLE_FL)


def test_a_usable_run_passes_and_nothing_is_created(tmp_path):
    check_run_paths(_cfg(tmp_path, "run.wandb=offline"))
    assert os.listdir(tmp_path) == []


def test_a_checkpoints_folder_that_is_a_file_is_refused_at_start_up(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoints").write_text("not a folder")
    _refused(_cfg(tmp_path), "run.dir (its checkpoints folder)",
             repr(str(tmp_path / "run" / "checkpoints")), "is a file, not a directory")


def test_an_immutable_checkpoints_folder_is_refused_at_start_up(tmp_path):
    ckpt = tmp_path / "run" / "checkpoints"
    ckpt.mkdir(parents=True)
    with immutable(str(ckpt)):
        _refused(_cfg(tmp_path), "run.dir (its checkpoints folder)", repr(str(ckpt)),
                 "is not writable (Operation not permitted)")


def test_a_local_tier_inside_a_file_is_refused(tmp_path):
    (tmp_path / "bb").write_text("a file")
    _refused(_cfg(tmp_path, f"training.save_local_dir={tmp_path / 'bb' / 'tier'}"),
             "checkpoint.save_local_dir", f"lies inside the file {str(tmp_path / 'bb')!r}")


def test_tensorboard_wandb_and_cache_folders_are_checked(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "tensorboard").write_text("")
    _refused(_cfg(tmp_path), "training.tensorboard", "tensorboard")
    (run / "wandb").write_text("")
    _refused(_cfg(tmp_path, "training.tensorboard=false", "run.wandb=offline"), "run.wandb")


def test_training_load_data_files_and_tokenizer_must_be_readable(tmp_path):
    _refused(_cfg(tmp_path, f"training.load={tmp_path / 'nowhere'}"), "checkpoint.load",
             "does not exist")
    prefix = tmp_path / "corpus"
    (tmp_path / "corpus.bin").write_bytes(b"")
    data = ["data.synthetic=false", f"data.paths=[{prefix}]"]
    _refused(_cfg(tmp_path, *data), "data.paths", f"{prefix}.idx")
    (tmp_path / "corpus.idx").write_bytes(b"")
    _refused(_cfg(tmp_path, *data, "data.tokenizer_type=sentencepiece",
                  f"data.tokenizer_model={tmp_path / 'spm.model'}"), "data.tokenizer_model")
    (tmp_path / "cache").write_text("")
    _refused(_cfg(tmp_path, *data, f"data.cache_dir={tmp_path / 'cache'}"), "data.cache_dir")


def test_a_runs_own_config_yaml_must_name_its_own_folder(tmp_path, monkeypatch):
    """run_paths.check_own_config: a run's config.yaml records run.dir as given (here relative
    to the folder the run started in). From that folder, or with --set run.dir, it is used as
    is; from another folder, or after the run folder was copied (an absolute run.dir naming the
    original), megatron-train refuses it instead of starting afresh elsewhere."""
    from megatron.training.run_paths import check_own_config
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    run = start / "runs" / "x"
    (run / "checkpoints").mkdir(parents=True)
    elsewhere.mkdir()
    (run / "config.yaml").write_text(load_config(None, ["run.dir=runs/x"]).to_yaml())
    own = str(run / "config.yaml")
    monkeypatch.chdir(start)
    check_own_config("runs/x/config.yaml", [], load_config("runs/x/config.yaml"))
    monkeypatch.chdir(elsewhere)
    with pytest.raises(InputError) as e:
        check_own_config(own, ["training.train_iters=5"], load_config(own))
    assert str(e.value).startswith(f"{own} is the config.yaml of the run in {run}, but its "
                                   "run.dir='runs/x' names another folder (relative to the "
                                   f"folder that run started in, so from here ({elsewhere}) it "
                                   f"is {elsewhere}/runs/x)"), e.value
    assert f"--set run.dir={run};" in str(e.value)
    for new in ("run.dir=/tmp/new", " run.dir = runs/y"):  # a new run from its settings
        check_own_config(own, [new], load_config(own))
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "metrics.jsonl").write_text("")
    (copy / "config.yaml").write_text(load_config(None, [f"run.dir={run}"]).to_yaml())
    with pytest.raises(InputError, match="where that run was before its folder was moved or "
                                         "copied"):
        check_own_config(str(copy / "config.yaml"), [], load_config(str(copy / "config.yaml")))
    plain = tmp_path / "config.yaml"  # a config.yaml that is not a run's: anything goes
    plain.write_text(load_config(None, ["run.dir=runs/z"]).to_yaml())
    check_own_config(str(plain), [], load_config(str(plain)))
    check_own_config(None, [], load_config(None))


def _run_started_in(folder, run_dir="runs/a"):
    """A run started in `folder` on relative data: its own config.yaml and metrics, as
    megatron-train leaves them; the config's path."""
    from tests.support.data import write_tokens
    (folder / "data").mkdir(parents=True)
    write_tokens(str(folder / "data" / "c"), [[1, 2, 3]] * 4)
    run = folder / run_dir
    run.mkdir(parents=True)
    cfg = load_config(TINY, [f"run.dir={run_dir}", "data.synthetic=false",
                             'data.paths=["data/c"]'])
    (run / "config.yaml").write_text(cfg.to_yaml())
    (run / "metrics.jsonl").write_text("")
    return str(run / "config.yaml")


def test_a_runs_relative_data_from_another_folder_names_the_folder_it_started_in(
        tmp_path, monkeypatch):
    from megatron.training.run_paths import started_in
    config = _run_started_in(tmp_path / "A")
    elsewhere = tmp_path / "B"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert started_in(config) == str(tmp_path / "A")
    cfg = load_config(config, [f"run.dir={tmp_path / 'A' / 'runs' / 'a'}"])
    with pytest.raises(InputError, match=r"'data/c.idx' cannot be read from here .* started in "
                                         + str(tmp_path / "A") + r", where it is .*A/data/c.idx"):
        check_run_paths(cfg, started_in(config))
    monkeypatch.chdir(tmp_path / "A")  # from where it started, the run reads them
    check_run_paths(cfg, started_in(config))


def test_where_a_run_started_is_unknown_but_for_a_runs_own_relative_run_dir(tmp_path):
    from megatron.training.run_paths import started_in
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(load_config(TINY, [f"run.dir={run}"]).to_yaml())
    assert started_in(str(run / "config.yaml")) is None  # not a run's: no metrics, checkpoints
    (run / "metrics.jsonl").write_text("")
    assert started_in(str(run / "config.yaml")) is None  # its run.dir is absolute
    assert started_in(TINY) is None and started_in(None) is None
    moved = _run_started_in(tmp_path / "C", run_dir="other")
    os.rename(tmp_path / "C" / "other", tmp_path / "C" / "moved")  # no longer ends with it
    assert started_in(moved.replace("other", "moved")) is None
