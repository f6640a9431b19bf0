"""megatron-generate: sample text from a trained run's latest checkpoint."""
from __future__ import annotations

import argparse
import logging
import math
import sys

import torch

from megatron.cli.common import count, entry_point, integer, number, setup_logging
from megatron.config.errors import InputError

log = logging.getLogger("megatron.generate")

EPILOG = """examples:
  megatron-generate --run-dir runs/demo --prompt "ROMEO:" --tokens 80
  megatron-generate --run-dir runs/demo --samples 3 --temperature 0.7 --top-k 20 --seed 1
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="megatron-generate", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True, help="run directory (config.yaml, checkpoints/)")
    p.add_argument("--prompt", default="", help="text to continue (default: start of a "
                   "document); a prompt longer than model.seq_length tokens is cut to its last "
                   "seq_length tokens, with a note on stderr")
    p.add_argument("--tokens", type=integer, default=64, help="new tokens per sample (at least 1)")
    p.add_argument("--samples", type=integer, default=1, help="samples to draw (at least 1)")
    p.add_argument("--temperature", type=number, default=0.8, help="0 picks the most likely "
                   "token")
    p.add_argument("--top-k", type=integer, default=40,
                   help="sample among the k most likely tokens (0: all)")
    p.add_argument("--seed", type=count(0, 2 ** 64 - 1), default=0,
                   help="the sampler's seed, 0 to 2^64-1 (torch's range; default 0)")
    return p.parse_args(argv)


def check_args(args) -> None:
    """Refuse values that would print nothing or fail deep inside torch."""
    for flag, value in (("--tokens", args.tokens), ("--samples", args.samples)):
        if value < 1:
            raise InputError(f"{flag}={value} is invalid: expected a positive number; pass for "
                             f"example {flag} {64 if flag == '--tokens' else 1}")
    if args.top_k < 0:
        raise InputError(f"--top-k={args.top_k} is invalid: expected 0 (all tokens) or a "
                         f"positive number; pass for example --top-k 40")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise InputError(f"--temperature={args.temperature} is invalid: expected a finite "
                         f"number >= 0 (0 picks the most likely token); pass for example "
                         f"--temperature 0.8")


@entry_point("megatron-generate")
def main(argv=None) -> int:
    args = parse_args(argv)
    check_args(args)
    setup_logging()
    from megatron.data.tokenizers import build_tokenizer, spec_from_config
    from megatron.checkpoint.convert import read_run_config
    from megatron.checkpoint.export import load_run
    cfg = read_run_config(args.run_dir)
    tok = build_tokenizer(spec_from_config(cfg))
    cfg, model = load_run(args.run_dir, tok.vocab_size)
    write_samples(args, tok, model, cfg.model.seq_length, sys.stdout)
    return 0


def write_samples(args, tok, model, seq_length: int, out) -> None:
    """args.samples continuations of args.prompt, each printed after the prompt the model saw."""
    from megatron.model.sampling import sample
    prompt = tok.tokenize(args.prompt) if args.prompt else [tok.eod]
    if len(prompt) > seq_length:
        # The model has no positions beyond seq_length: say so rather than cut in silence.
        log.warning("note: the prompt has %d tokens, more than model.seq_length=%d; it was cut "
                    "to its last %d tokens (the first %d are not used or printed)",
                    len(prompt), seq_length, seq_length, len(prompt) - seq_length)
        prompt = prompt[-seq_length:]
    gen = torch.Generator().manual_seed(args.seed)
    for i in range(args.samples):
        new = sample(model, prompt, args.tokens, seq_length, args.temperature, args.top_k,
                     tok.vocab_size, gen, eod=tok.eod)
        text = tok.detokenize(([] if not args.prompt else prompt) + new)
        out.write(f"--- sample {i + 1} ---\n{text}\n")


if __name__ == "__main__":
    sys.exit(main())
