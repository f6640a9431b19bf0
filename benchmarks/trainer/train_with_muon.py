#!/usr/bin/env python3
"""megatron-train as it started before the engine stood in for DeepSpeed's Muon modules: they
are imported first (torch.compile'd kernels, torch._inductor's compiler), so the engine finds
them loaded and leaves them. The start-up section's reference for what that import costs;
it shows under "python and CLI" here instead of "deepspeed initialize"."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: E402,F401
import deepspeed.runtime.zero.muon.original_muon  # noqa: E402,F401

from megatron.cli.train import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
