"""config/plugins.py: run.plugins, megatron-train --plugin and MEGATRON_PLUGINS import a user's
registrations before a config is checked; what --plugin imported is recorded in run.plugins, so a
saved config.yaml brings its plugins back wherever it is read; a module beside the current
directory is found as `python -m` would find it; every bad name is one error naming its field."""
import sys
import uuid

import pytest

from megatron.config import Config, ConfigError, build_config, load_config, variants
from megatron.config.plugins import NAME_HINT, load_plugins
from tests.support.paths import TINY

PLUGIN = '''from megatron.config import variants
variants.register(variants.Variant(
    "norm", "{name}", "megatron.model.norm:RMSNorm",
    weights=(variants.Weight("weight", lambda m: (m.hidden_size,)),)))
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A fresh module (package/module.py under tmp_path) registering a fresh norm's name; the
    name is unregistered afterwards. Returns (module, norm name, folder)."""
    made = []

    def make(on_path=True):
        tag = uuid.uuid4().hex[:8]
        package, name = f"plug_{tag}", f"norm_{tag}"
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "variants.py").write_text(PLUGIN.format(name=name))
        if on_path:
            monkeypatch.syspath_prepend(str(tmp_path))
        made.append(name)
        return f"{package}.variants", name, tmp_path

    yield make
    for name in made:
        variants.unregister("norm", name)


def test_a_configs_run_plugins_are_imported_before_its_names_are_checked(plugin, tmp_path):
    module, name, _ = plugin()
    with pytest.raises(ConfigError) as refused:
        load_config(TINY, [f"model.normalization={name}"])
    assert NAME_HINT in str(refused.value) and "run.plugins" in str(refused.value)
    cfg = load_config(TINY, [f"model.normalization={name}", f"run.plugins=[{module}]"])
    assert cfg.model.normalization == name and cfg.run.plugins == [module]


def test_a_saved_config_brings_its_plugins_back(plugin):
    """A run's config.yaml (Config.to_dict, read back by from_dict, as generate, convert and the
    metrics writer do) imports what it lists before its model section is built."""
    module, name, _ = plugin()
    saved = {"model": {"normalization": name}, "run": {"plugins": [module]}}
    sys.modules.pop(module, None)
    variants.unregister("norm", name)  # as in a fresh process
    cfg = Config.from_dict(saved)
    assert cfg.model.normalization == name and variants.get("norm", name).name == name
    assert Config.from_dict(cfg.to_dict()).run.plugins == [module]


def test_train_records_what_plugin_imported(plugin, capsys):
    from megatron.cli.train import main as train_main
    module, name, _ = plugin()
    assert train_main(["--config", TINY, "--plugin", module, "--plugin", module,
                       "--set", f"model.normalization={name}", "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert f"plugins:\n  - {module}\n" in printed  # once, though named twice


def test_a_module_in_the_current_directory_is_found_after_everything_installed(
        plugin, monkeypatch):
    """A console script's sys.path holds its own bin folder, not the current directory: the
    plugin beside the user's config is looked for there too, appended (never shadowing)."""
    module, name, folder = plugin(on_path=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(folder))])
    monkeypatch.chdir(folder)
    assert load_plugins([module]) == [module]
    assert sys.path[-1] == str(folder) and variants.get("norm", name)


def test_a_missing_module_names_its_field_and_a_broken_one_its_own_cause(
        plugin, tmp_path, monkeypatch):
    module, _, folder = plugin()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as missing:
        load_plugins(["no_such_plugin_pkg.variants"])
    assert "--plugin='no_such_plugin_pkg.variants'" in str(missing.value)
    assert "current directory" in str(missing.value)
    monkeypatch.setenv("MEGATRON_PLUGINS", "no_such_plugin_pkg")
    with pytest.raises(ConfigError, match="MEGATRON_PLUGINS='no_such_plugin_pkg'"):
        load_plugins()
    monkeypatch.delenv("MEGATRON_PLUGINS")
    # a plugin that exists but imports what is not installed: that module is named
    (folder / module.split(".")[0] / "broken.py").write_text("import not_installed_dep_xyz\n")
    with pytest.raises(ConfigError, match="not_installed_dep_xyz"):
        build_config({"run": {"plugins": [module.split(".")[0] + ".broken"]}})


@pytest.mark.parametrize("value, fragment", [
    ("mypkg.variants", "a list of Python module names"),
    ([3], "a list of Python module names"),
    (["mypkg/variants.py"], "'mypkg/variants.py' is not one"),
    (["mypkg.variants "], "'mypkg.variants ' is not one"),
    ([".relative"], "'.relative' is not one"),
])
def test_a_bad_run_plugins_value_is_one_error_naming_the_field(value, fragment):
    with pytest.raises(ConfigError) as refused:
        build_config({"run": {"plugins": value}})
    assert str(refused.value).startswith("run.plugins=") and fragment in str(refused.value)


def test_a_bad_plugin_flag_is_named_as_the_flag():
    with pytest.raises(ConfigError, match=r"^--plugin=.*'mypkg/variants.py' is not one"):
        load_plugins(["mypkg/variants.py"])


@pytest.mark.parametrize("key", ["model.normalization", "model.activation",
                                 "model.position_embedding_type", "model.attention_backend",
                                 "parallel.pipeline_schedule"])
def test_an_unknown_registry_name_says_how_a_plugin_brings_it(key):
    """Every field whose names a plugin may register: the fix names run.plugins, --plugin and
    MEGATRON_PLUGINS beside the built-in choices."""
    with pytest.raises(ConfigError) as refused:
        load_config(TINY, [f"{key}=made_up_name"])
    text = str(refused.value)
    assert text.startswith(f"{key}='made_up_name' is invalid") and NAME_HINT in text
    assert f"--set {key}=..." in text


def test_the_variant_lookup_names_the_plugin_fix_too():
    with pytest.raises(ConfigError) as refused:
        variants.get("norm", "made_up_norm")
    assert NAME_HINT in str(refused.value)
