"""megatron-generate: sample text from a trained run's latest checkpoint."""
from __future__ import annotations

import argparse
import sys

import torch

from megatron.cli.common import friendly_errors, setup_logging

EPILOG = """examples:
  megatron-generate --run-dir runs/demo --prompt "ROMEO:" --tokens 80
  megatron-generate --run-dir runs/demo --samples 3 --temperature 0.7 --top-k 20 --seed 1
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="megatron-generate", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True, help="run directory (config.yaml, checkpoints/)")
    p.add_argument("--prompt", default="", help="text to continue (default: start of a document)")
    p.add_argument("--tokens", type=int, default=64, help="new tokens per sample")
    p.add_argument("--samples", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


@friendly_errors
def main(argv=None) -> int:
    args = parse_args(argv)
    setup_logging()
    from megatron.data.tokenizers import build_tokenizer, spec_from_config
    from megatron.model.sampling import sample
    from megatron.training.convert import read_run_config
    from megatron.training.export import load_run
    cfg = read_run_config(args.run_dir)
    tok = build_tokenizer(spec_from_config(cfg))
    cfg, model = load_run(args.run_dir, tok.vocab_size)
    gen = torch.Generator().manual_seed(args.seed)
    prompt = tok.tokenize(args.prompt) if args.prompt else [tok.eod]
    for i in range(args.samples):
        new = sample(model, prompt, args.tokens, cfg.model.seq_length, args.temperature,
                     args.top_k, tok.vocab_size, gen, eod=tok.eod)
        text = tok.detokenize(([] if not args.prompt else prompt) + new)
        sys.stdout.write(f"--- sample {i + 1} ---\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
