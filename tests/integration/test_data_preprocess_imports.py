"""megatron/data is library code, checked in a fresh interpreter: preprocessing never imports
torch."""
import subprocess
import sys

from tests.support.paths import ROOT


def test_preprocessing_does_not_import_torch():
    """megatron-preprocess and its workers start in a fraction of a second without torch."""
    code = ("import sys, megatron.cli.preprocess, megatron.data.preprocess, "
            "megatron.data.indexed_dataset, megatron.data.tokenizers.gpt2_bpe; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
