"""Keys that left the training section for their owners' sections (eval, checkpoint,
resilience) still load from a YAML file, from --set and from a saved config.yaml, each with one
warning naming the new key; both spellings at once is an error. A failure names the path that
lost the mapping."""
import logging

import pytest
import yaml

from megatron.config import Config, ConfigError, build_config, load_config
from megatron.config.sections import MOVED
from megatron.base.deepspeed_json import deepspeed_config

WARNING = "training.save_interval is now checkpoint.save_interval"


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_every_moved_key_has_a_home_in_an_existing_section():
    """The training section's keys kept their names in their owners' sections; the model's MoE
    keys moved into its moe sub-section, the moe_ prefix dropped; fp16's loss-scaling keys into
    training.loss_scale."""
    for (old, name), (section, new) in MOVED.items():
        home = Config().to_dict()[section]
        if "." not in new:
            assert old == "training" and name == new and name in home
        else:
            sub, leaf = new.split(".")
            assert (old, section, sub) in {("model", "model", "moe"),
                                           ("training", "training", "loss_scale")}
            assert leaf in home[sub] and name not in home
            if sub == "moe":
                assert name.replace("moe_", "") == leaf


def test_an_old_loss_scale_key_loads_into_the_sub_section_and_both_at_once_is_refused(
        tmp_path, caplog):
    path = tmp_path / "c.yaml"
    path.write_text("training:\n  precision: fp16\n  initial_loss_scale_power: 12\n")
    with caplog.at_level(logging.WARNING):
        cfg = load_config(str(path), ["training.min_loss_scale=4"])
    scale = cfg.training.loss_scale
    assert (scale.initial_power, scale.minimum, scale.window) == (12, 4.0, 1000)
    assert "training.initial_loss_scale_power is now training.loss_scale.initial_power" in \
        " ".join(_warnings(caplog))
    assert Config.from_dict(cfg.to_dict()).training.loss_scale == scale  # a saved config's
    fp16 = deepspeed_config(cfg, 1, "cuda")["fp16"]  # what DeepSpeed's scaler is given
    assert (fp16["initial_scale_power"], fp16["min_loss_scale"], fp16["hysteresis"]) == \
        (12, 4.0, 2)
    with pytest.raises(ConfigError, match="training.hysteresis=3 is invalid: expected unset: "
                                          "it is now training.loss_scale.hysteresis"):
        path.write_text("training:\n  hysteresis: 3\n  loss_scale:\n    hysteresis: 5\n")
        load_config(str(path))


@pytest.mark.parametrize("key", ["training.check_state", "training.roll_back"])
def test_a_field_added_after_the_move_has_no_old_key(key):
    """resilience.check_state and checkpoint.roll_back came after the training section split:
    no config ever wrote them under training, so that spelling is an unknown key."""
    assert ("training", key.split(".")[1]) not in MOVED
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [f"{key}=true"])


def test_a_saved_config_with_a_key_this_version_does_not_know_is_refused_naming_it(tmp_path):
    """Config.from_dict (a run's config.yaml read back, a single-file model's config) checks
    its keys as a YAML file's are checked: a key or section of a newer version is one message,
    not a TypeError from a constructor or a section silently dropped."""
    for d, named in (({"training": {"check_state": True}}, "training.check_state"),
                     ({"checkpoint": {"roll_back_to": 3}}, "checkpoint.roll_back_to"),
                     ({"model": {"moe": {"experts_per_rank": 2}}}, "model.moe.experts_per_rank"),
                     ({"fp8": {"recipe": "delayed"}}, "fp8")):
        with pytest.raises(ConfigError, match=f"^{named} \\(a saved config\\).*newer version"):
            Config.from_dict(d)
    torch = pytest.importorskip("torch")
    from megatron.checkpoint.convert import SINGLE_FORMAT, load_single
    from megatron.config.errors import InputError
    config = Config().to_dict()
    config["model"]["fp8_recipe"] = "delayed"
    path = tmp_path / "model.pt"
    torch.save({"format": SINGLE_FORMAT, "config": config, "state_dict": {}, "vocab_size": 1,
                "padded_vocab_size": 1, "source": "x"}, path)
    with pytest.raises(InputError, match=f"^'{path}': its model's config cannot be read: "
                                         "model.fp8_recipe"):
        load_single(str(path))


def test_an_old_moe_key_loads_into_the_sub_section_from_yaml_set_and_a_saved_config(
        tmp_path, caplog):
    path = tmp_path / "old.yaml"
    path.write_text("model:\n  num_experts: 4\n  moe_top_k: 1\n  moe_router: sigmoid\n")
    cfg = load_config(str(path), ["model.moe_capacity_factor=1.5"])
    moe = cfg.model.moe
    assert (moe.num_experts, moe.top_k, moe.router, moe.capacity_factor) == (4, 1, "sigmoid",
                                                                              1.5)
    assert "model.moe_top_k is now model.moe.top_k" in " ".join(_warnings(caplog))
    saved = cfg.to_dict()
    assert "num_experts" not in saved["model"] and saved["model"]["moe"]["num_experts"] == 4
    old = dict(saved, model={**{k: v for k, v in saved["model"].items() if k != "moe"},
                             "num_experts": 4, "moe_top_k": 1})
    assert Config.from_dict(old).model.moe.top_k == 1
    new = load_config(str(path), ["model.moe.top_k=2"]).model.moe   # --set over the file
    assert (new.num_experts, new.top_k) == (4, 2)
    path.write_text("model:\n  moe_top_k: 1\n  moe:\n    num_experts: 4\n    top_k: 2\n")
    with pytest.raises(ConfigError, match="model.moe_top_k=1 is invalid: expected unset: it is "
                                          "now model.moe.top_k, which is set too"):
        load_config(str(path))


def test_an_old_key_in_yaml_loads_into_its_new_home_with_one_warning(tmp_path, caplog):
    path = tmp_path / "old.yaml"
    path.write_text("training:\n  train_iters: 7\n  save_interval: 3\n  hang_timeout_minutes: "
                    "2.5\n  eval_iters: 4\n")
    cfg = load_config(str(path))
    assert (cfg.training.train_iters, cfg.checkpoint.save_interval) == (7, 3)
    assert (cfg.resilience.hang_timeout_minutes, cfg.eval.eval_iters) == (2.5, 4)
    messages = _warnings(caplog)
    assert len(messages) == 1 and WARNING in messages[0] and "old.yaml" in messages[0]
    assert "training.eval_iters is now eval.eval_iters" in messages[0]


def test_an_old_key_in_set_is_typed_by_its_new_field(caplog):
    cfg = load_config(None, ["training.save_interval=5", "training.loss_spike_action=stop"])
    assert (cfg.checkpoint.save_interval, cfg.resilience.loss_spike_action) == (5, "stop")
    assert sum(WARNING in m for m in _warnings(caplog)) == 1
    with pytest.raises(ConfigError, match="checkpoint.save_interval='x' is invalid"):
        load_config(None, ["training.save_interval=x"])


def test_set_overrides_yaml_whichever_name_each_uses(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("training:\n  save: true\n")
    assert load_config(str(path), ["checkpoint.save=false"]).checkpoint.save is False
    path.write_text("checkpoint:\n  save: true\n")
    assert load_config(str(path), ["training.save=false"]).checkpoint.save is False


def test_both_names_in_one_file_is_an_error(tmp_path):
    path = tmp_path / "both.yaml"
    path.write_text("training:\n  save: true\ncheckpoint:\n  save: false\n")
    with pytest.raises(ConfigError, match="training.save=True is invalid: expected unset: it "
                                          "is now checkpoint.save"):
        load_config(str(path))


def test_a_saved_config_of_an_older_version_loads(caplog):
    old = Config().to_dict()
    for section in ("eval", "checkpoint", "resilience"):  # the keys the old version had
        old["training"].update({k: v for k, v in old.pop(section).items()
                                if ("training", k) in MOVED})
    old["training"].update(load="auto", max_rollbacks=7)
    text = yaml.safe_dump(old)
    cfg = Config.from_dict(yaml.safe_load(text))
    assert (cfg.checkpoint.load, cfg.resilience.max_rollbacks) == ("auto", 7)
    assert build_config(yaml.safe_load(text)).checkpoint.load == "auto"
    saved = [m for m in _warnings(caplog) if "(a saved config)" in m]
    assert len(saved) == 1 and "training.max_rollbacks is now resilience.max_rollbacks" in saved[0]
