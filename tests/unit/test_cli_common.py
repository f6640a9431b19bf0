"""cli.common.entry_point: every command's one error path, and who may end the process."""
import torch.distributed as dist

from megatron.cli.plan import main as plan_main


def test_an_error_returns_to_a_caller_whose_process_group_is_open(capsys, tmp_path):
    """A program (or a test) that calls main() as a function with its own process group open
    gets the exit status back; the process is not ended under it (os._exit is kept for a command
    that opened the group itself, where sys.exit could hang on peers)."""
    opened = not dist.is_initialized()
    if opened:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                                world_size=1)
    try:
        code = plan_main(["memory", "--model", "no-such-model", "--cluster", "frontier"])
        err = capsys.readouterr().err
    finally:
        if opened:
            dist.destroy_process_group()
    assert code == 2
    assert err.startswith("megatron-plan: error: ") and len(err.strip().splitlines()) == 1, err


PLUGIN = '''from megatron.config import variants
variants.register(variants.Variant("norm", "{name}", "megatron.model.norm:RMSNorm",
                                   weights=(variants.Weight("weight", lambda m: (m.hidden_size,)),)))
'''


def _plugin(tmp_path, monkeypatch, module, name):
    (tmp_path / f"{module}.py").write_text(PLUGIN.format(name=name))
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_plugin_registers_what_set_may_name(tmp_path, monkeypatch, capsys):
    """megatron-train --plugin MODULE (and MEGATRON_PLUGINS for every command) imports the
    module before the config is read (config/plugins.py); a module that cannot be imported is
    one error naming it."""
    from megatron.cli.train import main as train_main
    from megatron.config import variants
    from tests.support.paths import TINY
    _plugin(tmp_path, monkeypatch, "norm_plugin_a", "plugin_norm_a")
    _plugin(tmp_path, monkeypatch, "norm_plugin_b", "plugin_norm_b")
    try:
        assert train_main(["--config", TINY, "--set", "model.normalization=plugin_norm_a",
                           "--print-config"]) == 2  # not imported: refused, naming the field
        assert "model.normalization" in capsys.readouterr().err
        assert train_main(["--config", TINY, "--plugin", "norm_plugin_a", "--set",
                           "model.normalization=plugin_norm_a", "--print-config"]) == 0
        assert "normalization: plugin_norm_a" in capsys.readouterr().out
        monkeypatch.setenv("MEGATRON_PLUGINS", "norm_plugin_b")
        assert train_main(["--config", TINY, "--set", "model.normalization=plugin_norm_b",
                           "--print-config"]) == 0
        monkeypatch.setenv("MEGATRON_PLUGINS", "no_such_plugin_module")
        assert train_main(["--config", TINY, "--print-config"]) == 2
        assert "MEGATRON_PLUGINS" in capsys.readouterr().err
    finally:
        variants.unregister("norm", "plugin_norm_a")
        variants.unregister("norm", "plugin_norm_b")


def _joined_lines(path):
    """Line numbers in `path` where a string literal (not raw) ends a line with one backslash:
    Python joins the next line to it, so an example's shell continuation, meant to be printed,
    is lost and the two lines print as one. The backslash right after a string's opening quotes
    (a help text's first newline dropped) is meant."""
    import io
    import re
    import tokenize
    found = []
    with open(path) as f:
        tokens = list(tokenize.generate_tokens(io.StringIO(f.read()).readline))
    for tok in tokens:
        prefix = re.match(r"[A-Za-z]*", tok.string).group(0)
        if tok.type != tokenize.STRING or "r" in prefix.lower():
            continue
        quotes = 3 if tok.string[len(prefix):][:3] in ('"""', "'''") else 1
        start = len(prefix) + quotes + (tok.string[len(prefix) + quotes:].startswith("\\\n") * 2)
        for m in re.finditer(r"(\\+)\n", tok.string[start:]):
            if len(m.group(1)) % 2:
                found.append(tok.start[0] + tok.string[:start + m.start()].count("\n"))
    return found


def test_help_texts_keep_their_shell_continuations():
    """Every command's examples (--help) and every docstring print a trailing backslash as
    written: megatron-plan's Qwen3 example and three of megatron-preprocess's printed two
    lines as one, their backslash dropped. Checked over every Python file of the project."""
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    files = [p for d in ("megatron", "tests", "benchmarks", "tools")
             for p in (root / d).rglob("*.py")]
    files += [root / "setup.py"]
    assert len(files) > 300
    joined = {str(p.relative_to(root)): n for p in files for n in [_joined_lines(p)] if n}
    assert not joined, f"a string ends these lines with one backslash (write two): {joined}"
