#!/usr/bin/env python3
"""Prepare the demo corpus (Shakespeare), its SentencePiece vocabulary and .bin/.idx dataset.

A no-op when everything is cached. Prints the two values a training config needs:

    tokenizer_model=/.../.cache/demo/shakespeare_bpe4096.model
    data_prefix=/.../.cache/demo/shakespeare_text_document

examples:
  python tools/prepare_demo_data.py                   # cache in <repo>/.cache/demo
  python tools/prepare_demo_data.py --cache-dir /tmp/demo --vocab-size 8000
  eval "$(python tools/prepare_demo_data.py --shell)"  # sets TOKENIZER_MODEL and DATA_PREFIX
"""
from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split(
        "\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache-dir", default=os.path.join(REPO, ".cache", "demo"))
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shell", action="store_true", help="print shell assignments "
                   "TOKENIZER_MODEL=... DATA_PREFIX=...")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    sys.path.insert(0, REPO)  # runs from a checkout even before `pip install -e .`
    from megatron.config.errors import InputError
    from megatron.data.demo import prepare_demo_data

    try:
        data = prepare_demo_data(a.cache_dir, a.vocab_size, a.workers)
    except InputError as e:
        sys.stderr.write(f"prepare_demo_data: error: {e}\n")
        return 2
    if a.shell:
        print(f"TOKENIZER_MODEL={shlex.quote(data.tokenizer_model)}")
        print(f"DATA_PREFIX={shlex.quote(data.data_prefix)}")
    else:
        print(f"tokenizer_model={data.tokenizer_model}")
        print(f"data_prefix={data.data_prefix}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
