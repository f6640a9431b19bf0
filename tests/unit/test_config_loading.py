"""Strict config loading: YAML file + --set overrides, typed, unknown keys rejected, and the
cross-section checks of validate_for_world, each naming the field and value."""

import pytest

from megatron.config import (Config, ConfigError, InputError, load_config, parse_overrides,
                             validate_for_world)
from megatron.base.deepspeed_json import deepspeed_config
from tests.support.paths import TINY


def write(tmp_path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_tiny_loads_with_yaml_values_and_defaults():
    cfg = load_config(TINY)
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_attention_heads) == (4, 64, 4)
    assert cfg.model.ffn_hidden_size == 256 and cfg.model.max_position_embeddings == 64
    assert cfg.training.global_batch_size == 16 and cfg.data.synthetic is True


def test_no_file_gives_defaults():
    assert load_config(None).to_dict() == Config().to_dict()


def test_overrides_beat_yaml_and_later_beat_earlier():
    cfg = load_config(TINY, ["model.hidden_size=128", "training.train_iters=3",
                             "training.train_iters=5"])
    assert cfg.model.hidden_size == 128 and cfg.training.train_iters == 5
    assert cfg.model.num_layers == 4  # untouched keys keep the file's value


def test_resolved_yaml_round_trips(tmp_path):
    cfg = load_config(TINY, ["optimizer.lr=6e-5", "optimizer.min_lr=6e-6", "data.paths=[a, b]"])
    assert load_config(write(tmp_path, cfg.to_yaml())).to_dict() == cfg.to_dict()


@pytest.mark.parametrize("item, section, key, value", [
    ("model.hidden_size=128", "model", "hidden_size", 128),
    (" model.hidden_size = 128 ", "model", "hidden_size", 128),
    ("optimizer.lr=6e-5", "optimizer", "lr", 6e-5),  # YAML 1.1 alone would keep a string
    ("optimizer.lr=1E-3", "optimizer", "lr", 1e-3),
    ("optimizer.lr=2", "optimizer", "lr", 2.0),
    ("training.tensorboard=false", "training", "tensorboard", False),
    ("parallel.sequence_parallel=true", "parallel", "sequence_parallel", True),
    ("data.paths=[0.5 a, 0.5 b]", "data", "paths", ["0.5 a", "0.5 b"]),
    ("data.paths=single/prefix", "data", "paths", ["single/prefix"]),
    ("model.num_query_groups=null", "model", "num_query_groups", None),
    ("checkpoint.load=none", "checkpoint", "load", None),
    ("run.wandb=off", "run", "wandb", "off"),  # a Literal of strings is taken verbatim too
    ("run.dir=runs/2024.10", "run", "dir", "runs/2024.10"),
    ("run.dir=2024.10", "run", "dir", "2024.10"),  # strings verbatim, not YAML-parsed
    ("run.dir=a=b", "run", "dir", "a=b"),  # split at the first '='
    ("data.tokenizer_model=on", "data", "tokenizer_model", "on"),
])
def test_set_parsing(item, section, key, value):
    parsed = parse_overrides([item])
    assert parsed == {section: {key: value}}
    assert type(parsed[section][key]) is type(value)


@pytest.mark.parametrize("item, field, shown, expected", [
    ("model.hiden_size=64", "model.hiden_size", "'64'", "known key"),
    ("modle.hidden_size=64", "modle.hidden_size", "'64'", "section among"),
    ("hidden_size=64", "--set", "'hidden_size=64'", "section.key=value"),
    ("model.hidden_size", "--set", "'model.hidden_size'", "section.key=value"),
    ("training.micro_batch_size=abc", "training.micro_batch_size", "'abc'", "an integer"),
    ("training.micro_batch_size=2.5", "training.micro_batch_size", "2.5", "an integer"),
    ("training.micro_batch_size=true", "training.micro_batch_size", "True", "an integer"),
    ("optimizer.lr=fast", "optimizer.lr", "'fast'", "a number"),
    ("training.tensorboard=maybe", "training.tensorboard", "'maybe'", "true or false"),
    ("training.tensorboard=1", "training.tensorboard", "1", "true or false"),
    ("model.hidden_size=null", "model.hidden_size", "'null'", "cannot be null"),
    ("run.dir=null", "run.dir", "'null'", "cannot be null"),
    ("data.paths=[a,", "data.paths", "'[a,'", "YAML syntax"),
    ("data.paths={a: 1}", "data.paths", "{'a': 1}", "a list"),
])
def test_set_errors_name_field_and_value(item, field, shown, expected):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, [item])
    assert str(e.value).startswith(f"{field}={shown} is invalid")
    assert expected in str(e.value)


@pytest.mark.parametrize("text, field, expected", [
    ("model:\n  hiden_size: 64\n", "model.hiden_size", "known key"),
    ("modle:\n  hidden_size: 64\n", "modle", "section among"),
    ("model:\n  hidden_size: sixty\n", "model.hidden_size", "an integer"),
    ("model:\n  hidden_size:\n", "model.hidden_size", "cannot be null"),
    ("training:\n  precision: fp8\n", "training.precision", "one of fp32, bf16, fp16"),
    ("model: [1, 2]\n", "model", "a mapping"),
    ("data:\n  paths: {a: 1}\n", "data.paths", "a list"),
    ("optimizer:\n  lr: yes\n", "optimizer.lr", "a number"),
])
def test_yaml_errors_name_field(tmp_path, text, field, expected):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text))
    assert str(e.value).startswith(field) and expected in str(e.value)


def test_yaml_scientific_floats_and_null_optional(tmp_path):
    cfg = load_config(write(tmp_path, "optimizer:\n  lr: 6e-5\n  min_lr: 6.0e-6\n"
                                      "checkpoint:\n  load:\n"))
    assert (cfg.optimizer.lr, cfg.optimizer.min_lr, cfg.checkpoint.load) == (6e-5, 6e-6, None)


def test_missing_and_unparsable_files(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_config(str(tmp_path / "nope.yaml"))
    with pytest.raises(InputError, match="not valid YAML"):
        load_config(write(tmp_path, "model: [\n"))
    with pytest.raises(InputError, match="mapping of sections"):
        load_config(write(tmp_path, "- 1\n"))


@pytest.mark.parametrize("text, key, lines", [
    ("optimizer:\n  lr: 0.1\n  min_lr: 0.0\n  lr: 0.2\n", "lr", (2, 4)),
    ("model:\n  num_layers: 2\noptimizer:\n  lr: 0.1\nmodel:\n  hidden_size: 64\n", "model",
     (1, 5)),
])
def test_a_key_written_twice_is_refused_with_both_lines(tmp_path, text, key, lines):
    # PyYAML alone keeps the last value and drops the first without a word.
    with pytest.raises(InputError, match=rf"key '{key}' appears twice \(lines {lines[0]} and "
                                         rf"{lines[1]}\); keep one"):
        load_config(write(tmp_path, text))


def test_a_cluster_file_with_a_repeated_key_is_refused(tmp_path):
    from megatron.planner.profile import load_profile
    path = tmp_path / "cluster.yaml"
    path.write_text("name: mine\ngpus_per_node: 8\ngpus_per_node: 4\n")
    with pytest.raises(InputError, match="'gpus_per_node' appears twice"):
        load_profile(str(path))


@pytest.mark.parametrize("overrides, field, value", [
    (["model.hidden_size=62"], "model.hidden_size", "62"),
    (["model.num_query_groups=3"], "model.num_query_groups", "3"),
    (["model.max_position_embeddings=32"], "model.max_position_embeddings", "32"),
    (["optimizer.min_lr=0.1"], "optimizer.min_lr", "0.1"),
    (["model.hidden_dropout=1.0"], "model.hidden_dropout", "1.0"),
    (["data.synthetic=false"], "data.paths", "[]"),
    # fp16's loss scaler: a window of 0 divides by zero, hysteresis 0 never lowers the scale, a
    # minimum of 0 lets every gradient reach 0; a negative eps makes Adam's denominator 0
    (["training.loss_scale.window=0"], "training.loss_scale.window", "0"),
    (["training.loss_scale.hysteresis=0"], "training.loss_scale.hysteresis", "0"),
    (["training.loss_scale.minimum=0"], "training.loss_scale.minimum", "0.0"),
    (["training.loss_scale.initial_power=-1"], "training.loss_scale.initial_power", "-1"),
    (["training.loss_scale.initial_power=128"], "training.loss_scale.initial_power", "128"),
    # the run's length named twice, differently
    (["training.train_iters=10", "training.train_samples=100"], "training.train_samples",
     "100"),
    (["training.train_iters=null", "training.train_samples=0"], "training.train_samples", "0"),
    (["optimizer.adam_eps=-1e-8"], "optimizer.adam_eps", "-1e-08"),
    # torch.manual_seed overflowed at start-up (a traceback); a negative seed is refused too
    (["training.seed=18446744073709551616"], "training.seed", "18446744073709551616"),
    (["training.seed=-1"], "training.seed", "-1"),
])
def test_section_checks(overrides, field, value):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, overrides)
    assert str(e.value).startswith(f"{field}={value}")


@pytest.mark.parametrize("overrides, world, field, value", [
    (["parallel.tensor_parallel_size=4"], 2, "parallel.tensor_parallel_size", 4),
    (["parallel.tensor_parallel_size=2", "parallel.pipeline_parallel_size=2"], 6,
     "parallel.tensor_parallel_size", 2),
    (["model.hidden_size=48", "model.num_attention_heads=3",
      "parallel.tensor_parallel_size=2"], 2, "model.num_attention_heads", 3),
    (["model.num_query_groups=1", "parallel.tensor_parallel_size=2"], 2,
     "model.num_query_groups", 1),
    (["model.ffn_hidden_size=255", "parallel.tensor_parallel_size=2"], 2,
     "model.ffn_hidden_size", 255),
    (["model.seq_length=63", "parallel.tensor_parallel_size=2",
      "parallel.sequence_parallel=true"], 2, "model.seq_length", 63),
    (["parallel.pipeline_parallel_size=2", "parallel.zero_stage=2"], 2, "parallel.zero_stage", 2),
    (["parallel.pipeline_parallel_size=2", "parallel.zero_stage=3"], 2, "parallel.zero_stage", 3),
    (["model.num_layers=2", "parallel.pipeline_parallel_size=4"], 4, "model.num_layers", 2),
    (["training.global_batch_size=15"], 1, "training.global_batch_size", 15),
    (["training.global_batch_size=12", "training.micro_batch_size=4"], 2,
     "training.global_batch_size", 12),
])
def test_validate_for_world(overrides, world, field, value):
    cfg = load_config(TINY, overrides)
    with pytest.raises(ConfigError) as e:
        validate_for_world(cfg, world)
    assert str(e.value).startswith(f"{field}={value!r}")


def test_valid_layouts_return_dp_and_deepspeed_json():
    cfg = load_config(TINY, ["parallel.tensor_parallel_size=2", "parallel.sequence_parallel=true"])
    assert validate_for_world(cfg, 4) == 2
    ds = deepspeed_config(cfg, 2)
    assert ds["train_batch_size"] == 16 and ds["gradient_accumulation_steps"] == 4
    assert ds["train_micro_batch_size_per_gpu"] == 2 and "pipeline" not in ds
    pp = load_config(TINY, ["parallel.pipeline_parallel_size=2", "training.precision=bf16",
                            "training.activation_checkpointing=full"])
    assert validate_for_world(pp, 2) == 1
    ds = deepspeed_config(pp, 1)
    assert ds["bf16"] == {"enabled": True} and ds["pipeline"]["activation_checkpoint_interval"] == 0


PATH_FIELDS = ["run.dir", "checkpoint.save_local_dir", "checkpoint.load", "checkpoint.init_from",
               "data.tokenizer_model", "data.vocab_file", "data.merges_file", "data.cache_dir"]


@pytest.mark.parametrize("field", PATH_FIELDS)
@pytest.mark.parametrize("path,token,tail", [
    ("~/runs/a", "~", ' (here ~/runs/a is /home/me/runs/a), or let the shell expand it: --set '
                      '{field}="$HOME/runs/a"'),
    ("/mnt/bb/$USER/ckpt", "$USER", ' (here /mnt/bb/$USER/ckpt is /mnt/bb/me/ckpt), or let the '
                                    'shell expand it: --set {field}="/mnt/bb/$USER/ckpt"'),
    ("/l/${PROJ_NO_SUCH_VAR}/x", "${PROJ_NO_SUCH_VAR}", ', or let the shell expand it: --set '
                                                        '{field}="/l/${{PROJ_NO_SUCH_VAR}}/x"'),
    ("~root/m", "~root", ""),  # the shell expands ~user only unquoted: the full path it is
])
def test_a_path_field_with_shell_syntax_is_refused(monkeypatch, field, path, token, tail):
    """A config is not a shell: run.dir: $MEMBERWORK/runs made a folder named '$MEMBERWORK' in
    the working directory and trained into it; every path field now says so, with the path
    the shell would have given (where it can) and how to let the shell give it."""
    monkeypatch.setenv("HOME", "/home/me")
    monkeypatch.setenv("USER", "me")
    with pytest.raises(ConfigError) as e:
        load_config(TINY, [f"{field}={path}"])
    message = str(e.value)
    assert message.startswith(f"{field}={path!r} is invalid: expected a path written out: a "
                              f"config does not expand {token!r} as a shell does"), message
    if token != "~root":
        assert message.endswith("write the path in full" + tail.format(field=field)), message


def test_shell_syntax_in_a_blend_item_and_paths_that_only_look_alike():
    with pytest.raises(ConfigError, match=r"data.paths=\['0.7 /d/a', '0.3 ~/d/b'\] is invalid: "
                                          r".* \(here ~/d/b is .*/d/b\)$"):
        load_config(TINY, ["data.synthetic=false", "data.paths=[0.7 /d/a, 0.3 ~/d/b]"])
    # a '~' inside a name and a '$' not followed by a name are not what a shell expands
    cfg = load_config(TINY, ["run.dir=runs/a~b", "checkpoint.init_from=/m/a$1.pt",
                             "checkpoint.load=auto"])
    assert (cfg.run.dir, cfg.checkpoint.init_from) == ("runs/a~b", "/m/a$1.pt")


def test_an_input_not_found_says_when_its_tilde_was_not_expanded(monkeypatch):
    """--config=~/a.yaml reaches the command as written (bash expands ~ at a word's start
    only): the message says so, with the path the shell would have given."""
    from megatron.base.rundir import RunDir
    monkeypatch.setenv("HOME", "/home/me")
    note = ("('~' in it was not expanded by a shell, which expands ~ only at a word's start and "
            "nothing in a config; here it is /home/me/{})")
    with pytest.raises(InputError) as e:
        load_config("~/a.yaml")
    assert f"config file '~/a.yaml' does not exist {note.format('a.yaml')}; pass" in str(e.value)
    with pytest.raises(InputError) as e:
        RunDir("~/runs/a").require()
    assert f"'~/runs/a' does not exist {note.format('runs/a')}; pass" in str(e.value)
    with pytest.raises(InputError) as e:
        load_config("/no/such/a.yaml")
    assert "does not exist; pass" in str(e.value)


@pytest.mark.parametrize("algo", ["ulysses", "ring", "allgather", "hybrid"])
def test_document_masks_pass_under_every_context_parallel_algorithm(algo):
    """Each algorithm's blocks take the documents of the keys they see (ring, all-gather and
    hybrid were refused before: model/context_attention.hidden_keys)."""
    cp = 4 if algo == "hybrid" else 2
    cfg = load_config(TINY, ["data.reset_attention_mask=true", "data.reset_position_ids=true",
                             f"parallel.context_parallel_size={cp}",
                             "parallel.tensor_parallel_size=2",
                             f"parallel.context_parallel_algo={algo}", "parallel.zero_stage=0"]
                      + (["parallel.ulysses_degree=2"] if algo == "hybrid" else []))
    assert validate_for_world(cfg, 2 * cp * 2) == 2


def test_document_masks_need_a_core_that_takes_them():
    """flash (and a plugin core without the record's `documents`) is refused by name; auto
    picks the first core that takes a mask."""
    import torch
    from megatron.model.attention import resolve_attention_backend
    cpu = torch.device("cpu")
    with pytest.raises(ConfigError, match=r"model.attention_backend='flash' is invalid: expected "
                                          r"a core that takes a document mask .*sdpa, math"):
        resolve_attention_backend("flash", cpu, "bf16", documents=True)
    assert resolve_attention_backend("auto", cpu, "fp32", documents=True) == "sdpa"
    assert resolve_attention_backend("math", cpu, "fp32", documents=True) == "math"
