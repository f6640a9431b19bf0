"""Every numeric flag of the console commands refuses a value outside its range with one line
that names the flag, the value and what was expected, exit 2: never a traceback (megatron-plan
search --micro-batches 0 divided by zero) and never a silent default (--seq-length 0 priced the
preset's 2048). Count flags are typed at the parser (cli/common.count); the rest are checked by
the library they reach, and each of those is exercised below too."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from megatron.cli import common, plan
from megatron.cli import preprocess
from megatron.config.errors import ConfigError
from megatron.planner import jobs
from tests.support.paths import ROOT


def _count_flags(parser: argparse.ArgumentParser, prefix=()):
    """(subcommand path, flag, least) for every flag typed by common.count, subparsers too."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _count_flags(sub, prefix + (name,))
        elif getattr(action.type, "__name__", "").startswith("integer >= "):
            least = int(action.type.__name__.split(">= ")[1])
            yield prefix, action.option_strings[-1], least


PLAN_FLAGS = sorted(set(_count_flags(plan.build_parser())))
REQUIRED = {("scaling",): ["--nodes", "16,32"]}  # a subcommand's required flags


def test_the_plan_commands_type_their_count_flags():
    flags = {flag for _, flag, _ in PLAN_FLAGS}
    assert {"--nodes", "--global-batch", "--seq-length", "--tp", "--pp", "--micro-batch",
            "--top", "--max-tp", "--interleave", "--steps", "--warmup", "--step"} <= flags
    assert {sub for sub, _, _ in PLAN_FLAGS} >= {("memory",), ("search",), ("calibrate",),
                                                 ("longest",), ("scaling",)}


@pytest.mark.parametrize("sub,flag,least", PLAN_FLAGS,
                         ids=[f"{'-'.join(s)}{f}" for s, f, _ in PLAN_FLAGS])
def test_a_count_below_its_least_is_argparse_s_one_line_error(sub, flag, least, capsys):
    for bad in (str(least - 1), "x", "\u0663"):  # Arabic-Indic three: int() takes it
        with pytest.raises(SystemExit) as stop:
            plan.build_parser().parse_args([*sub, flag, bad])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"argument {flag}: '{bad}' is invalid: expected an integer >= {least}" in err, err
    assert getattr(plan.build_parser().parse_args([*sub, *REQUIRED.get(sub, []), flag,
                                                   str(least)]),
                   flag.lstrip("-").replace("-", "_")) == least


SEARCH_175B = ["search", "--model", "175b", "--cluster", "frontier"]


@pytest.mark.parametrize("argv,message", [
    ([*SEARCH_175B, "--micro-batches", "0"],
     "--micro-batches='0' is invalid: expected comma-separated integers >= 1"),
    ([*SEARCH_175B, "--tp-values", "2,0"], "--tp-values='2,0' is invalid"),
    ([*SEARCH_175B, "--pp-values", "-4"], "--pp-values='-4' is invalid"),
    ([*SEARCH_175B, "--memory-fraction", "0"],
     "--memory-fraction=0.0 is invalid: expected a share in (0, 1]"),
    ([*SEARCH_175B, "--zero-stages", "4"], "--zero-stages='4' is invalid"),
    # an empty item was dropped ("1,,4" searched 1 and 4), other scripts' digits were read
    ([*SEARCH_175B, "--tp-values", "1,,4"], "--tp-values='1,,4' is invalid: expected "
     "comma-separated integers, e.g. 1,2,4; an item is empty"),
    ([*SEARCH_175B, "--micro-batches", "1,2,"], "an item is empty"),
    ([*SEARCH_175B, "--schedules", "1f1b,,zbh1"], "--schedules='1f1b,,zbh1' is invalid"),
    ([*SEARCH_175B, "--cp-algos", "ring,"], "an item is empty"),
    ([*SEARCH_175B, "--pp-values", "2,\u0664"], "--pp-values='2,\u0664' is invalid"),
    (["scaling", "--model", "175b", "--cluster", "frontier", "--nodes", "16,,64"],
     "--nodes='16,,64' is invalid"),
    # the preset's default batch: the fix names multiples that divide
    (["memory", "--model", "22b", "--cluster", "frontier", "--nodes", "3", "--tp", "2"],
     "--global-batch=1280 is invalid: expected a multiple of micro-batch x DP (1 x 12); "
     "pass --global-batch 1284 or 1272"),
    (["calibrate", "--config", "examples/local/tiny.yaml", "--steps", "3", "--warmup", "3"],
     "--warmup=3 is invalid: expected fewer steps than --steps (3)"),
    # sizes a dense model cannot take were searched as EP 1 without a word
    (["search", "--model", "22b", "--cluster", "frontier", "--ep-values", "2,4"],
     "--ep-values='2,4' is invalid: expected 1 for a dense model"),
])
def test_the_values_the_library_checks_exit_2_naming_the_flag(argv, message, capsys,
                                                               monkeypatch):
    monkeypatch.chdir(ROOT)
    assert plan.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    # a flag's fix is on the command line, not in a config field --set could reach
    assert "--set --" not in err


def test_the_library_refuses_what_it_once_replaced_by_a_default():
    with pytest.raises(ConfigError, match=r"--seq-length=0 is invalid"):
        jobs.load_job("22b", seq_length=0)
    with pytest.raises(ConfigError, match=r"--global-batch=0 is invalid"):
        jobs.load_job("22b", global_batch=0)
    with pytest.raises(ConfigError, match=r"--max-tp=0 is invalid"):
        jobs.search_space(max_tp=0)
    job, _, _ = jobs.load_job("22b", seq_length=4096, global_batch=64)
    assert (job.model.seq_length, job.global_batch) == (4096, 64)


def test_seconds_flags_refuse_zero_negative_and_infinity():
    for bad in ("0", "-1", "inf", "nan", "soon"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected seconds > 0"):
            common.positive_seconds(bad)
    assert common.positive_seconds("2.5") == 2.5
    for bad in ("-1", "inf", "nan"):  # where 0 means every update
        with pytest.raises(argparse.ArgumentTypeError, match="expected seconds >= 0"):
            common.seconds(zero=True)(bad)
    encode = ["--input", "a", "--output-prefix", "b", "--tokenizer-type", "null"]
    parsed = preprocess._encode_parser().parse_args(encode + ["--log-interval", "0"])
    assert parsed.log_interval == 0
    with pytest.raises(SystemExit):
        preprocess._encode_parser().parse_args(encode + ["--log-interval", "-1"])


def test_no_cli_flag_takes_a_bare_number_without_a_check():
    """A flag typed common.integer or common.number (or int or float) in megatron/cli is one of
    these, each checked where it is read (or any integer is meaningful); every other number is
    a count or seconds type."""
    checked = {"--exit-status",  # any status the training step returned
               "--tokens", "--samples", "--temperature", "--top-k",  # generate.check_args
               "--memory-fraction",  # jobs.search_space, above
               "--zero",  # choices 0-3
               "--vocab-size", "--workers",  # preprocess's encode checks (null tokenizer, >= 1)
               "--character-coverage"}  # SentencePiece's own check, its message forwarded
    bare = re.compile(r"""add_argument\(\s*"(--[a-z-]+)"[^)]*type=(int|float|integer|number)\b""")
    found = {m.group(1) for path in Path(ROOT, "megatron", "cli").glob("*.py")
             for m in bare.finditer(path.read_text())}
    assert {"--zero", "--memory-fraction", "--top-k"} <= found  # the pattern sees them
    assert found <= checked, f"numeric flags without a check: {sorted(found - checked)}"


def test_number_types_take_ascii_digits_only():
    assert common.integer("12") == 12 and common.number("0.5") == 0.5
    for parse in (common.integer, common.number, common.count(0), common.seconds()):
        with pytest.raises((ValueError, argparse.ArgumentTypeError)):
            parse("\u0663")  # int('٣') is 3
    with pytest.raises(SystemExit):
        plan.build_parser().parse_args([*SEARCH_175B, "--memory-fraction", "\u0660.5"])


def test_a_config_file_given_as_model_is_sent_to_config(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = ["memory", "--cluster", "frontier", "--model"]
    assert plan.main([*argv, "examples/local/tiny.yaml"]) == 2
    err = capsys.readouterr().err
    assert "a training config goes to --config: pass --config examples/local/tiny.yaml\n" in err
    assert plan.main([*argv, "nowhere.yml"]) == 2
    assert "pass --config nowhere.yml (there is no file 'nowhere.yml' either)" in \
        capsys.readouterr().err
    assert plan.main([*argv, "23b"]) == 2
    assert "pick a preset, or pass a training config with --config" in capsys.readouterr().err


def test_calibrate_refuses_a_bad_core_and_missing_results_before_probing(capsys, monkeypatch,
                                                                        tmp_path):
    monkeypatch.chdir(ROOT)
    base = ["calibrate", "--config", "examples/local/tiny.yaml", "--results",
            str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "p.yaml")]
    with pytest.raises(SystemExit) as stop:
        plan.main([*base, "--flash-backend", "flashy"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "argument --flash-backend: 'flashy' is invalid: expected " \
        "one of auto, flash, sdpa, math" in err, err
    assert plan.main([*base, "--fit-only"]) == 2
    out, err = capsys.readouterr()
    assert f"there is no file '{tmp_path / 'none.jsonl'}'" in err and "probed" not in out + err
    assert not (tmp_path / "p.yaml").exists()


def test_a_seed_outside_torch_s_range_is_refused_at_the_parser(capsys):
    """--seed 2**64 reached torch.manual_seed after the model was loaded: a ValueError
    traceback ('Overflow when unpacking long long')."""
    from megatron.cli import generate
    assert generate.parse_args(["--run-dir", "r", "--seed", str(2 ** 64 - 1)]).seed == 2 ** 64 - 1
    for bad in (str(2 ** 64), "-1"):
        with pytest.raises(SystemExit):
            generate.parse_args(["--run-dir", "r", "--seed", bad])
        assert f"argument --seed: '{bad}' is invalid: expected an integer" in \
            capsys.readouterr().err
