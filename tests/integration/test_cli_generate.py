"""megatron-generate: bad sampling arguments are one message and exit 2 (checked before any model
is loaded); a prompt longer than model.seq_length is cut to its last seq_length tokens with a
note, not in silence."""
import argparse
import io
import logging
import subprocess
import sys

import pytest
import torch

from tests.support.paths import ROOT
from megatron.cli import generate
from megatron.data.tokenizers.null import NullTokenizer


def run_generate(*args):
    return subprocess.run([sys.executable, "-m", "megatron.cli.generate", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, fragment", [
    (["--tokens", "0"], "--tokens=0 is invalid: expected a positive number"),
    (["--tokens", "-3"], "--tokens=-3 is invalid: expected a positive number"),
    (["--samples", "0"], "--samples=0 is invalid"),
    (["--top-k", "-1"], "--top-k=-1 is invalid"),
    (["--temperature", "nan"], "--temperature=nan is invalid"),
])
def test_bad_arguments_are_one_message(tmp_path, args, fragment):
    proc = run_generate("--run-dir", str(tmp_path / "no-run"), *args)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert fragment in proc.stderr
    assert proc.stderr.strip().count("\n") == 0  # one line
    assert proc.stdout == ""


class _Recorder(torch.nn.Module):
    """Always predicts token 5; remembers every window it was given."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.windows = []

    def forward(self, tokens):  # [b, s] -> [s, b, V]
        self.windows.append(tokens[0].tolist())
        logits = torch.zeros(tokens.shape[1], tokens.shape[0], self.vocab)
        logits[..., 5] = 10.0
        return logits


def _args(prompt, tokens=3):
    return argparse.Namespace(prompt=prompt, tokens=tokens, samples=1, temperature=0.0,
                              top_k=0, seed=0)


def test_long_prompt_is_cut_to_the_last_seq_length_tokens_with_a_note(caplog):
    tok, model, out = NullTokenizer(50), _Recorder(50), io.StringIO()
    prompt = " ".join(str(i) for i in range(20, 40))  # 20 tokens
    with caplog.at_level(logging.WARNING, logger="megatron.generate"):
        generate.write_samples(_args(prompt), tok, model, 8, out)
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1
    assert "prompt has 20 tokens, more than model.seq_length=8" in notes[0]
    assert "cut to its last 8 tokens" in notes[0]
    assert model.windows[0] == list(range(32, 40))
    assert out.getvalue() == "--- sample 1 ---\n" + " ".join(map(str, range(32, 40))) + \
        " 5 5 5\n"


def test_short_prompt_has_no_note(caplog):
    tok, model, out = NullTokenizer(50), _Recorder(50), io.StringIO()
    with caplog.at_level(logging.WARNING, logger="megatron.generate"):
        generate.write_samples(_args("1 2 3", tokens=2), tok, model, 8, out)
    assert caplog.records == []
    assert model.windows[0] == [1, 2, 3] and out.getvalue().endswith("1 2 3 5 5\n")
