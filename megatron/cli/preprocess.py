"""megatron-preprocess: a corpus (JSON lines, gzip, zstd, parquet, `datasets` folders, folders and
globs of shards) -> Megatron .bin/.idx, merging, tokenizer training."""
from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional

from megatron.base.outputs import check_output
from megatron.cli.common import count, entry_point, integer, number, seconds
from megatron.config.errors import InputError

EXAMPLES = """\
examples:
  # GPT-2 BPE, two worker processes, one eod token after each document:
  megatron-preprocess --input corpus.jsonl.gz --output-prefix data/corpus \\
      --tokenizer-type gpt2 --vocab-file vocab.json --merge-file merges.txt \\
      --append-eod --workers 2
  #   -> data/corpus_text_document.bin and .idx; train with
  #      --set "data.paths=[data/corpus_text_document]"

  # FineWeb: a dump folder of parquet shards (read in path order), the "text" column:
  megatron-preprocess --input fineweb/data/CC-MAIN-2024-10 --output-prefix data/fw \\
      --tokenizer-type huggingface --tokenizer-model tokenizer.json --append-eod --workers 16

  # Dolma (*.json.gz), the Pile or SmolLM (*.jsonl.zst): a glob, quoted, sorted:
  megatron-preprocess --input 'pile/train/*.jsonl.zst' --output-prefix data/pile \\
      --tokenizer-type gpt2 --vocab-file vocab.json --merge-file merges.txt --append-eod

  # a folder written by datasets' save_to_disk (a Dataset, or one split of a DatasetDict):
  megatron-preprocess --input saved/ --split train --output-prefix data/saved \\
      --tokenizer-type sentencepiece --tokenizer-model spm.model

  # a SentencePiece model, two JSON keys (one output per key):
  megatron-preprocess --input a.jsonl b.jsonl --output-prefix data/ab --json-keys title text \\
      --tokenizer-type sentencepiece --tokenizer-model spm.model --append-eod

  # pre-tokenized data ("text" holds ids as a list or space-separated, or a list of
  # such lists or strings: one sequence each):
  megatron-preprocess --input ids.jsonl --output-prefix data/ids --tokenizer-type null \\
      --vocab-size 50257

  # merge shards into one dataset:
  megatron-preprocess merge --inputs data/s0_text_document data/s1_text_document \\
      --output-prefix data/all_text_document

  # train a SentencePiece vocabulary on text or JSON-lines files:
  megatron-preprocess train-tokenizer --input books.txt web.jsonl.gz \\
      --model-prefix tok/spm8k --vocab-size 8000 --model-type bpe
"""


def _encode_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="megatron-preprocess",
        description="Tokenize a corpus into Megatron MMIDIDX datasets,\n"
                    "PREFIX_KEY_document.bin/.idx, readable by Megatron-LM, Megatron-DeepSpeed\n"
                    "and GPT-NeoX, laid out as Megatron-LM's tools/preprocess_data.py lays\n"
                    "them out: each line is one document; a text is one sequence, a list of\n"
                    "texts one sequence per element; a document with no tokens is kept empty;\n"
                    "tokens are uint16 for vocabularies below 65500, else int32.\n"
                    "Inputs, told apart by content: JSON lines (plain, gzip, zstd), parquet\n"
                    "(a row is a document, --json-keys name the columns), Arrow streams, folders\n"
                    "written by datasets' save_to_disk, folders and globs of shards (one corpus,\n"
                    "in path order). Every route writes the same bytes for the same texts.\n"
                    "Subcommands: merge, train-tokenizer (each has --help).",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="files, folders or globs, read in "
                   "the order given (a folder's or a glob's files in path order)")
    p.add_argument("--output-prefix", required=True,
                   help="writes PREFIX_KEY_document.bin/.idx")
    p.add_argument("--json-keys", nargs="+", default=["text"], help="keys (JSON) or columns "
                   "(parquet, Arrow) to tokenize (default: text)")
    p.add_argument("--split", help="the split of a datasets DatasetDict folder (default: its "
                   "only split, else train)")
    p.add_argument("--tokenizer-type", required=True, help="sentencepiece | gpt2 | huggingface "
                   "| null (Megatron names such as GPT2BPETokenizer also work)")
    p.add_argument("--tokenizer-model", help="SentencePiece .model or Hugging Face "
                   "tokenizer.json")
    p.add_argument("--vocab-file", help="GPT-2 vocab.json")
    p.add_argument("--merge-file", help="GPT-2 merges.txt")
    p.add_argument("--vocab-size", type=integer,
                   help="vocabulary size of pre-tokenized data (null)")
    p.add_argument("--append-eod", action="store_true", help="end each document with the "
                   "tokenizer's end-of-document token")
    p.add_argument("--prepend-bos", action="store_true", help="begin each document with the "
                   "tokenizer's beginning-of-document token (Llama 3's <|begin_of_text|>, "
                   "Gemma's <bos>: continued pretraining of such models)")
    p.add_argument("--workers", type=integer, default=1, help="tokenizing processes (default 1)")
    p.add_argument("--log-interval", type=seconds(zero=True), default=1.0,
                   help="seconds between progress lines (0: a line at every update)")
    return p


def _merge_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="megatron-preprocess merge",
        description="Concatenate datasets (in the given order) into one.",
        epilog="example:\n  megatron-preprocess merge --inputs data/s0_text_document "
               "data/s1_text_document \\\n      --output-prefix data/all_text_document",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", nargs="+", required=True, help="dataset prefixes to merge")
    p.add_argument("--output-prefix", required=True, help="writes PREFIX.bin/.idx")
    return p


def _train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="megatron-preprocess train-tokenizer",
        description="Train a SentencePiece BPE or unigram vocabulary (identity normalization and "
                    "byte fallback,\nso every text encodes and decodes back exactly).",
        epilog="example:\n  megatron-preprocess train-tokenizer --input books.txt web.jsonl.gz "
               "\\\n      --model-prefix tok/spm8k --vocab-size 8000 --model-type unigram",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="text files (one sentence or "
                   "line each) or JSON-lines files (.jsonl/.json, optionally .gz)")
    p.add_argument("--model-prefix", required=True,
                   help="writes PREFIX.model and PREFIX.vocab")
    p.add_argument("--vocab-size", type=count(2), default=8000)
    p.add_argument("--model-type", choices=("bpe", "unigram"), default="bpe")
    p.add_argument("--json-keys", nargs="+", default=["text"], help="text keys of JSON lines")
    p.add_argument("--character-coverage", type=number, default=1.0)
    p.add_argument("--max-sentences", type=count(0), default=0, help="train on at most this many "
                   "lines (0: all)")
    return p


class _Progress:
    """A self-overwriting progress bar on a terminal (share of the input read, documents,
    tokens, MB/s, ETA), plain lines otherwise (logs, CI)."""

    def __init__(self):
        self.tty = sys.stderr.isatty()

    def __call__(self, stats) -> None:
        end = "\r" if self.tty else "\n"
        sys.stderr.write(stats.bar() + end)
        sys.stderr.flush()


def _run_encode(argv: List[str]) -> None:
    from megatron.data.preprocess import PreprocessJob, preprocess
    from megatron.data.tokenizers import TokenizerSpec, canonical_type

    a = _encode_parser().parse_args(argv)
    check_output("--output-prefix", a.output_prefix, "prefix", example="corpus")
    names = {"type": "--tokenizer-type", "model": "--tokenizer-model",
             "vocab_file": "--vocab-file", "merges_file": "--merge-file",
             "vocab_size": "--vocab-size"}
    kind = canonical_type(a.tokenizer_type)
    if a.vocab_size is not None and kind != "null":  # the vocabulary is the tokenizer's own
        raise InputError(f"--vocab-size={a.vocab_size} is set, but --tokenizer-type="
                         f"{a.tokenizer_type!r} does not read it (its vocabulary is its files'): "
                         f"leave --vocab-size out, or use --tokenizer-type null for token ids")
    spec = TokenizerSpec(kind, a.tokenizer_model, a.vocab_file, a.merge_file, a.vocab_size,
                         names)
    job = PreprocessJob(a.input, a.output_prefix, spec, a.json_keys, a.append_eod, a.workers,
                        split=a.split, prepend_bos=a.prepend_bos)
    progress = _Progress()
    prefixes, stats = preprocess(job, progress, a.log_interval)
    if progress.tty:
        sys.stderr.write("\n")
    print(stats.line())
    for prefix in prefixes:
        print(f"wrote {prefix}.bin and {prefix}.idx")
    if stats.empty:
        print(f"{stats.empty} documents had no tokens: kept as empty documents (no sequences)"
              f", as Megatron-LM does")


def _run_merge(argv: List[str]) -> None:
    from megatron.data.indexed_builder import merge_datasets

    a = _merge_parser().parse_args(argv)
    check_output("--output-prefix", a.output_prefix, "prefix", example="corpus")
    documents = merge_datasets(a.inputs, a.output_prefix)
    print(f"wrote {a.output_prefix}.bin and {a.output_prefix}.idx ({documents} documents)")


def _run_train(argv: List[str]) -> None:
    from megatron.data.tokenizers.train import train_sentencepiece

    a = _train_parser().parse_args(argv)
    check_output("--model-prefix", a.model_prefix, "prefix", example="spm")
    path = train_sentencepiece(a.input, a.model_prefix, a.vocab_size, a.model_type, a.json_keys,
                               a.character_coverage, a.max_sentences)
    print(f"wrote {path}")


@entry_point("megatron-preprocess", interrupted="interrupted; no output was renamed into place")
def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    commands = {"merge": _run_merge, "train-tokenizer": _run_train}
    run = commands.get(argv[0]) if argv else None
    if run is not None:
        run(argv[1:])
    else:
        _run_encode(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
