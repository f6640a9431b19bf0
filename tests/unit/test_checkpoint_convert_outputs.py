"""megatron-convert checks where it writes before it reads a checkpoint (a merge or an import of
a large model takes minutes): an --output that is a folder, an --output-dir that is a file, each
refused with one line and exit 2 before the run or the Hugging Face folder is opened (here they
do not exist, so an error about them would mean the order is wrong). The single file is written
whole or not at all: a failed write leaves neither a truncated file nor its temporary."""
import os

import pytest
import torch

from megatron.checkpoint.convert import MergedCheckpoint, load_single, save_single
from megatron.cli.convert import main
from megatron.config import load_config
from megatron.config.errors import InputError
from tests.support.paths import TINY


def _refused(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("megatron-convert: error: ") and message in err, err
    assert "no-such" not in err, f"the input was read before the output was checked: {err}"


def test_outputs_are_checked_before_any_checkpoint_is_read(tmp_path, capsys):
    folder, taken = tmp_path / "out", tmp_path / "taken.json"
    folder.mkdir()
    taken.write_text("{}")
    _refused(capsys, ["to-single", "--run-dir", str(tmp_path / "no-such-run"), "--output",
                      str(folder)], f"--output: '{folder}' names a directory: expected a file "
                                    f"to write; add a name, e.g. {folder / 'model.pt'}")
    _refused(capsys, ["from-hf", "--hf-dir", str(tmp_path / "no-such-hf"), "--output",
                      str(folder)], f"--output: '{folder}' names a directory")
    _refused(capsys, ["to-hf", "--run-dir", str(tmp_path / "no-such-run"), "--output-dir",
                      str(taken)], f"--output-dir: '{taken}' is a file, not a directory")
    _refused(capsys, ["to-hf", "--run-dir", str(tmp_path / "no-such-run"), "--output-dir",
                      str(taken / "hf")], f"--output-dir: '{taken / 'hf'}' lies inside the file "
                                          f"'{taken}'")
    _refused(capsys, ["to-single", "--run-dir", str(tmp_path / "no-such-run"), "--output",
                      str(taken / "m.pt")], f"--output: '{taken / 'm.pt'}' lies inside the file")
    (folder / "x").write_text("")
    _refused(capsys, ["to-hf", "--run-dir", str(tmp_path / "no-such-run"), "--output-dir",
                      str(folder)], f"--output-dir: '{folder}' is not empty")
    assert taken.read_text() == "{}" and os.listdir(folder) == ["x"]


def test_the_single_file_is_written_whole_or_not_at_all(tmp_path):
    cfg = load_config(TINY)
    good = MergedCheckpoint(cfg, {"w": torch.arange(4.0)}, 10, 16, "test")
    path = str(tmp_path / "m.pt")
    save_single(good, path)
    assert os.listdir(tmp_path) == ["m.pt"]
    assert torch.equal(load_single(path).state_dict["w"], torch.arange(4.0))
    bad = MergedCheckpoint(cfg, {"w": torch.arange(4.0), "f": lambda: None}, 10, 16, "test")
    with pytest.raises(Exception):  # pickling a lambda fails part way through the write
        save_single(bad, str(tmp_path / "b.pt"))
    assert os.listdir(tmp_path) == ["m.pt"]
    with pytest.raises(InputError, match="does not exist; write it with megatron-convert"):
        load_single(str(tmp_path / "b.pt"))


@pytest.mark.parametrize("overrides,message", [
    ({"model": {"normalization": "rmsnorm"}}, "this model maps to no Hugging Face architecture"),
    ({"data": {"synthetic": False, "paths": ["/no-such-dir/corpus"],
               "tokenizer_type": "sentencepiece",
               "tokenizer_model": "/no-such-dir/spm.model"}},
     "tokenizer file(s) /no-such-dir/spm.model named in the run's config do not exist here"),
])
def test_to_hf_checks_the_run_config_before_it_merges(tmp_path, capsys, overrides, message):
    """What to-hf needs from the run's config alone (an architecture the model maps to, the
    tokenizer files) was found after the merge; the run here has no checkpoint, so an error
    about the checkpoint would mean the merge ran first."""
    import yaml
    cfg = load_config(TINY).to_dict()
    for section, values in overrides.items():
        cfg[section].update(values)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["to-hf", "--run-dir", str(run), "--output-dir", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert message in err and "checkpoint" not in err.split("error:", 1)[1], err
    assert sorted(os.listdir(tmp_path)) == ["run"]
