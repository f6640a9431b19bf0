"""megatron-train under torchrun with rank MEGATRON_TEST_SLOW_RANK's forward passes made
MEGATRON_TEST_SLOW_BY (e.g. 0.3: 30%) slower by sleeping after each, as a throttled GPU would
be; the other ranks run as they are. The whole of DeepSpeed's forward is slowed (what the
engine's ComputeTimer spans), not only the model's: slowing the model alone would leave the
engine's own share of the span unslowed and the rank less than 30% slower. Launched by path:

    torchrun --nproc_per_node 2 tests/support/straggler_worker.py --config ... --set ...
"""
import os
import sys
import time

from deepspeed.runtime.engine import DeepSpeedEngine

from megatron.cli.train import main


def _slowed(forward, by: float):
    def slow(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = forward(self, *args, **kwargs)
        time.sleep(by * (time.perf_counter() - t0))
        return out
    return slow


if __name__ == "__main__":
    slow_rank = os.environ.get("MEGATRON_TEST_SLOW_RANK")
    if slow_rank is not None and os.environ.get("RANK") == slow_rank:
        DeepSpeedEngine.forward = _slowed(DeepSpeedEngine.forward,
                                          float(os.environ["MEGATRON_TEST_SLOW_BY"]))
    sys.exit(main(sys.argv[1:]))
