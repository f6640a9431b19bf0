"""Worker for the checkpoint conversion tests: in one 4-rank launch, trains examples/local/tiny.yaml
for 2 steps as TP2 x PP2 (GPT-2 and Llama flavours) and as TP1/PP1 (DP4, GPT-2), saves each
checkpoint, and records the validation loss the (sharded) engine computes on one fixed global
batch with the saved weights, as JSON (rank 0).

    torchrun --nproc_per_node 4 tests/support/convert_worker.py --workdir W --out r.json
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

from megatron.config import load_config
from megatron.training.loop import train

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, when run by path
from worker_exit import exit_after  # noqa: E402
from paths import TINY  # noqa: E402

# Evaluation at the last step, before the save, sees exactly the weights the checkpoint holds.
COMMON = ["training.train_iters=2", "training.save=true", "training.tensorboard=false",
          "training.global_batch_size=8", "training.micro_batch_size=2",
          "training.eval_interval=2", "training.eval_iters=1", "model.attention_backend=sdpa"]

FLAVOURS = {
    "gpt2": [],
    # 600 tokens pad to 768 rows under TP2 (640 under TP1): exercises the padded vocabulary.
    "llama": ["model.position_embedding_type=rotary", "model.normalization=rmsnorm",
              "model.activation=swiglu", "model.num_query_groups=2",
              "model.add_bias_linear=false", "model.tie_embeddings=false",
              "model.vocab_size=600"],
}

RUNS = {
    "tp2pp2-gpt2": FLAVOURS["gpt2"] + ["parallel.tensor_parallel_size=2",
                                       "parallel.pipeline_parallel_size=2"],
    "tp2pp2-llama": FLAVOURS["llama"] + ["parallel.tensor_parallel_size=2",
                                         "parallel.pipeline_parallel_size=2"],
    "single-gpt2": FLAVOURS["gpt2"],
}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", required=True, help="shared by all ranks (run directories)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results = {}
    for name, overrides in RUNS.items():
        run_dir = os.path.join(args.workdir, name)
        t0 = time.perf_counter()
        summary = train(load_config(TINY, COMMON + overrides + [f"run.dir={run_dir}"]))
        results[name] = {"run_dir": run_dir, "losses": summary.losses,
                         "valid_loss": summary.valid_losses[-1],
                         "seconds": time.perf_counter() - t0}
    if int(os.environ.get("RANK", "0")) == 0:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    exit_after(main)
