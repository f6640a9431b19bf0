"""The engine's stand-ins for DeepSpeed's Muon modules (engine/engine.py): DeepSpeed's ZeRO and
bf16 optimizers only ask whether our AdamW is a Muon optimizer, and get the real answer without
loading torch._inductor.compile_fx; anything else asked of the modules loads the real ones."""
import subprocess
import sys

from tests.support.paths import ROOT

SCRIPT = """
import sys
import torch
from megatron.engine.engine import _import_deepspeed
_import_deepspeed()
from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam
from deepspeed.runtime.zero.muon.original_muon import muon_update
opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
print("INSTANCE", isinstance(opt, MuonWithAuxAdam))
print("INDUCTOR", "torch._inductor.compile_fx" in sys.modules)
try:
    muon_update(None, None, 0.9)
except RuntimeError as e:
    print("REFUSED", "AdamW" in str(e))
from deepspeed.runtime.zero.muon.muon_optimizer import adam_update  # not stood in for: real
from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam as Real
print("REAL", Real.__module__, callable(adam_update))
"""


def test_stand_ins_answer_like_the_real_modules_without_inductor():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "INSTANCE False" in out and "INDUCTOR False" in out and "REFUSED True" in out, out
    assert "REAL deepspeed.runtime.zero.muon.muon_optimizer True" in out, out
