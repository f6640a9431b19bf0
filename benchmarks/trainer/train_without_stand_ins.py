#!/usr/bin/env python3
"""megatron-train as it started before the engine stood in for DeepSpeed's Muon modules: the
stand-ins are switched off, so DeepSpeed imports Muon (torch.compile'd kernels, torch._inductor's
compiler) inside deepspeed.initialize as it did. The start-up section's reference for that cost."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import megatron.engine.engine as engine  # noqa: E402
from megatron.cli.train import main  # noqa: E402

engine._stand_ins_for_muon = lambda: None

if __name__ == "__main__":
    sys.exit(main())
