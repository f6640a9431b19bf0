"""One rule for every place a command writes (`base.outputs.check_output`), checked before any
input is read: a path under a file, a file where a directory goes and the reverse, an empty or
unprintable path, a place that cannot be written; a missing folder is created. Each command's
outputs are swept with a path under a file (it raised a bare 'File exists' or 'Not a directory'
from megatron-report, megatron-preprocess and megatron-convert to-hf, the last after the
merge), and the commands that write files are run into a folder that does not exist yet.
Files are written whole or not at all (`write_whole`); the real full disk under megatron-plan
and megatron-report is tests/integration/test_cli_outputs_full_disk_tmpfs.py."""
import errno
import os

import pytest

from megatron.base.outputs import check_files, check_output, write_text_whole, write_whole
from megatron.config.errors import InputError
from tests.support.paths import TINY


@pytest.fixture
def taken(tmp_path):
    path = tmp_path / "taken"
    path.write_text("mine\n")
    return path


@pytest.mark.parametrize("kind", ["dir", "file", "prefix"])
def test_a_path_under_a_file_is_refused_for_every_kind(taken, kind):
    with pytest.raises(InputError) as e:
        check_output("--flag", str(taken / "a" / "b"), kind)
    assert str(e.value) == (f"--flag: {str(taken / 'a' / 'b')!r} lies inside the file "
                            f"{str(taken)!r}, where a directory is needed; remove the file or "
                            "choose another path")


def test_the_wrong_kind_empty_and_unprintable_paths_are_refused(tmp_path, taken):
    with pytest.raises(InputError, match="is a file, not a directory"):
        check_output("run.dir", str(taken), "dir")
    for kind, example in (("file", "out"), ("prefix", "corpus")):
        for path in (str(tmp_path), str(tmp_path) + "/", ".", ".."):
            with pytest.raises(InputError, match="names a directory") as e:
                check_output("--o", path, kind, example=example)
            assert str(e.value).endswith(f"add a name, e.g. {os.path.join(path, example)}")
        with pytest.raises(InputError, match="--o: the path is empty"):
            check_output("--o", "", kind)
    with pytest.raises(InputError, match="newline or another unprintable character"):
        check_output("--o", str(tmp_path / "a\nb"), "file")
    assert sorted(os.listdir(tmp_path)) == ["taken"]


def test_what_can_be_written_passes_and_nothing_is_created(tmp_path, taken):
    check_output("--o", str(taken), "file")  # replaced when written
    check_output("--o", str(tmp_path / "new" / "deeper" / "x"), "prefix")
    check_output("--o", str(tmp_path / "new" / "run"), "dir")
    check_output("--o", str(tmp_path), "dir")
    assert sorted(os.listdir(tmp_path)) == ["taken"]


def test_a_folder_that_cannot_be_written_is_refused(tmp_path):
    """A probe file, not permission bits (root passes every bit): /proc is read-only to all."""
    with pytest.raises(InputError, match=r"'/proc/x' \(its folder '/proc'\) is not writable"):
        check_output("--o", "/proc/x", "file")
    if os.access("/proc/self", os.W_OK):  # the bits say yes; the probe says no
        with pytest.raises(InputError, match="is not writable"):
            check_output("--o", "/proc/self/run", "dir")


def test_two_flags_on_one_file_are_refused_however_spelled(tmp_path, capsys):
    check_files(("--a", str(tmp_path / "x")), ("--b", None), ("--c", str(tmp_path / "y")))
    with pytest.raises(InputError) as e:
        check_files(("--a", str(tmp_path / "x")), ("--c", f"{tmp_path}/./x"))
    assert str(e.value) == (f"--c: '{tmp_path}/./x' is --a's file too: expected another file "
                            "(the second would overwrite the first); give each its own path")
    # calibrate's fitted profile over its own trial results (checked with --fit-only too)
    results = tmp_path / "r.jsonl"
    results.write_text("")
    for trials in (["--trials", "1"], ["--fit-only"]):
        assert _calibrate("--out", results, tmp_path, trials) == 2
        assert f"--out: '{results}' is --results's file too" in capsys.readouterr().err
    assert results.read_text() == "" and sorted(os.listdir(tmp_path)) == ["r.jsonl"]


def _plan(*argv):
    from megatron.cli.plan import main
    return main(["search", "--model", "gpt3-125m", "--cluster", "a100", *argv])


def _calibrate(flag, path, tmp_path, trials=("--trials", "1")):
    from megatron.cli.plan import main
    argv = {"--out": tmp_path / "p.yaml", "--results": tmp_path / "r.jsonl",
            "--run-root": tmp_path / "trials"}
    argv[flag] = path
    return main(["calibrate", "--config", TINY, *trials,
                 *(a for k, v in argv.items() for a in (k, str(v)))])


def _sweep():
    """(command, flag, a call that writes to `path` with inputs that do not exist)."""
    from megatron.cli import convert, plan, preprocess, report
    missing = "/no-such-input"
    return [
        ("megatron-plan search", "--out-config", lambda p, t: _plan("--out-config", p)),
        ("megatron-plan search", "--out-sbatch", lambda p, t: _plan("--out-sbatch", p)),
        ("megatron-plan scaling", "--plot", lambda p, t: plan.main(
            ["scaling", "--model", "gpt3-125m", "--cluster", "a100", "--nodes", "1,2",
             "--plot", p])),
        ("megatron-plan calibrate", "--out", lambda p, t: _calibrate("--out", p, t)),
        ("megatron-plan calibrate", "--results", lambda p, t: _calibrate("--results", p, t)),
        ("megatron-plan calibrate", "--run-root", lambda p, t: _calibrate("--run-root", p, t)),
        ("megatron-convert to-single", "--output", lambda p, t: convert.main(
            ["to-single", "--run-dir", missing, "--output", p])),
        ("megatron-convert from-hf", "--output", lambda p, t: convert.main(
            ["from-hf", "--hf-dir", missing, "--output", p])),
        ("megatron-convert to-hf", "--output-dir", lambda p, t: convert.main(
            ["to-hf", "--run-dir", missing, "--output-dir", p])),
        ("megatron-report", "--output", lambda p, t: report.main([missing, "--output", p])),
        ("megatron-preprocess", "--output-prefix", lambda p, t: preprocess.main(
            ["--input", missing, "--tokenizer-type", "null", "--output-prefix", p])),
        ("megatron-preprocess merge", "--output-prefix", lambda p, t: preprocess.main(
            ["merge", "--inputs", missing, "--output-prefix", p])),
        ("megatron-preprocess train-tokenizer", "--model-prefix", lambda p, t: preprocess.main(
            ["train-tokenizer", "--input", missing, "--model-prefix", p])),
    ]


@pytest.mark.parametrize("command,flag,call", _sweep(), ids=[f"{c} {f}" for c, f, _ in _sweep()])
def test_every_command_refuses_an_output_under_a_file_before_reading(tmp_path, taken, capsys,
                                                                     command, flag, call):
    path = str(taken / "out.png")  # a name every output takes (--plot needs the extension)
    assert call(path, tmp_path) == 2
    out, err = capsys.readouterr()
    assert f"error: {flag}: {path!r}" in err and f"lies inside the file {str(taken)!r}" in err, err
    assert "no-such-input" not in err and not out, (out, err)
    assert sorted(os.listdir(tmp_path)) == ["taken"] and taken.read_text() == "mine\n"


def test_outputs_in_a_folder_that_does_not_exist_yet_are_written(tmp_path, capsys, monkeypatch):
    """The folder is made, as megatron-train makes run.dir: megatron-plan refused it before,
    megatron-convert to-single too, while the others made it."""
    from megatron.cli import plan, preprocess
    new = tmp_path / "new" / "deeper"
    assert _plan("--out-config", str(new / "best.yaml"), "--out-sbatch",
                 str(tmp_path / "s" / "best.sbatch")) == 0
    assert (new / "best.yaml").is_file() and (tmp_path / "s" / "best.sbatch").is_file()
    assert plan.main(["scaling", "--model", "gpt3-125m", "--cluster", "a100", "--nodes", "1,2",
                      "--plot", str(tmp_path / "plots" / "s.png")]) == 0
    assert (tmp_path / "plots" / "s.png").stat().st_size > 0
    source = tmp_path / "a.jsonl"
    source.write_text('{"text": "1 2 3"}\n')
    assert preprocess.main(["--input", str(source), "--tokenizer-type", "null", "--vocab-size",
                            "10", "--output-prefix", str(tmp_path / "data" / "x")]) == 0
    assert (tmp_path / "data" / "x_text_document.idx").is_file()
    capsys.readouterr()


def test_a_file_is_written_whole_or_not_at_all(tmp_path):
    """A writer that fails part way (an interrupt, a full disk) leaves the old file as it was
    and no temporary; a full disk is one InputError naming the file; the folder is made."""
    path = tmp_path / "new" / "best.yaml"
    write_text_whole(str(path), "the config", "a: 1\n")
    assert path.read_text() == "a: 1\n" and os.listdir(path.parent) == ["best.yaml"]

    def fails(error):
        def write(tmp):
            assert tmp.endswith(".yaml") and os.path.basename(tmp).startswith(".best.tmp-")
            with open(tmp, "w") as f:
                f.write("a: 2\npart")
            raise error
        return write
    with pytest.raises(KeyboardInterrupt):
        write_whole(str(path), "the config", fails(KeyboardInterrupt()))
    with pytest.raises(InputError) as e:
        write_whole(str(path), "the config", fails(OSError(errno.ENOSPC, "No space left")))
    assert str(e.value).startswith(f"{path}: no space left on device while writing the config (")
    assert path.read_text() == "a: 1\n" and os.listdir(path.parent) == ["best.yaml"]


def test_a_symbolic_link_is_written_through(tmp_path):
    (tmp_path / "v3.yaml").write_text("old\n")
    (tmp_path / "current.yaml").symlink_to("v3.yaml")
    write_text_whole(str(tmp_path / "current.yaml"), "the config", "new\n")
    assert (tmp_path / "current.yaml").is_symlink()
    assert (tmp_path / "v3.yaml").read_text() == "new\n"


@pytest.mark.parametrize("kind", ["dir", "file", "prefix"])
def test_shell_syntax_no_shell_expanded_is_refused(monkeypatch, kind):
    monkeypatch.setenv("HOME", "/home/me")
    with pytest.raises(InputError) as e:
        check_output("--output", "~/x", kind)
    assert str(e.value) == ("--output: '~/x' holds '~', which no shell expanded (bash expands ~ "
                            "at a word's start only, not after --output=), and would name a "
                            "folder called '~'; write the path out (here /home/me/x), or let the "
                            "shell expand it: --output ~/x")
    with pytest.raises(InputError, match=r"'\$NO_SUCH_VAR_X/x' holds '\$NO_SUCH_VAR_X', which no "
                                         r"shell expanded \(a config value, or single quotes\).*"
                                         r"write the path out, or let the shell expand it: "
                                         r"--output \"\$NO_SUCH_VAR_X/x\"$"):
        check_output("--output", "$NO_SUCH_VAR_X/x", kind)
    check_output("--output", "/tmp/a~b$1", kind)  # neither is what a shell expands


@pytest.mark.parametrize("command,flag,call", _sweep(), ids=[f"{c} {f}" for c, f, _ in _sweep()])
def test_every_command_refuses_a_tilde_no_shell_expanded(tmp_path, capsys, monkeypatch, command,
                                                         flag, call):
    """--output=~/x reaches the command as written (bash expands ~ at a word's start only): it
    made a folder named '~' in the working directory."""
    monkeypatch.chdir(tmp_path)
    assert call("~/out.png", tmp_path) == 2
    out, err = capsys.readouterr()
    assert f"error: {flag}: '~/out.png' holds '~', which no shell expanded" in err, err
    assert not out and os.listdir(tmp_path) == [], (out, os.listdir(tmp_path))


def test_a_file_replaced_keeps_its_permission_bits(tmp_path):
    script = tmp_path / "best.sbatch"
    script.write_text("#!/bin/bash\n")
    script.chmod(0o750)
    write_text_whole(str(script), "the sbatch script", "#!/bin/bash\necho new\n")
    assert script.read_text().endswith("echo new\n") and (script.stat().st_mode & 0o777) == 0o750
