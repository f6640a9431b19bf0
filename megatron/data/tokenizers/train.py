"""Training SentencePiece vocabularies (BPE or unigram) from text or JSON-lines files."""
from __future__ import annotations

import logging
import os
import uuid
from typing import Iterable, Iterator, List, Sequence

from megatron.config.errors import InputError, unexpanded
from megatron.data.jsonl import is_jsonl, iter_json_texts, open_lines

log = logging.getLogger(__name__)

# SentencePiece drops training sentences longer than this many bytes; lines are far shorter.
_MAX_SENTENCE_BYTES = 16384


def _sentences(paths: Sequence[str], json_keys: Sequence[str], limit: int) -> Iterator[str]:
    """Lines of the inputs (texts of JSON lines are split at newlines), at most `limit`."""
    count = 0
    for path in paths:
        texts: Iterable[str]
        if is_jsonl(path):
            texts = (t for _, t in iter_json_texts(path, json_keys))
        else:
            texts = (raw.decode("utf-8", errors="replace") for raw in open_lines(path))
        for text in texts:
            for line in text.splitlines():
                if line.strip():
                    yield line
                    count += 1
                    if limit and count >= limit:
                        return


def train_sentencepiece(inputs: Sequence[str], model_prefix: str, vocab_size: int,
                        model_type: str = "bpe", json_keys: Sequence[str] = ("text",),
                        character_coverage: float = 1.0, max_sentences: int = 0,
                        normalization: str = "identity", threads: int = 0) -> str:
    """Writes MODEL_PREFIX.model and .vocab (atomically) and returns the .model path.

    Defaults favour exact round trips for language modelling: the identity normalization keeps
    whitespace and characters as written (nmt_nfkc would fold runs of spaces), and byte fallback
    encodes any character outside the vocabulary as its UTF-8 bytes instead of <unk>."""
    import sentencepiece as spm

    if model_type not in ("bpe", "unigram"):
        raise InputError(f"--model-type={model_type!r} is invalid: expected bpe or unigram")
    missing = [p for p in inputs if not os.path.isfile(p)]
    if missing:
        raise InputError(f"tokenizer training input {missing[0]} does not exist"
                         f"{unexpanded(missing[0])}: expected text "
                         f"or JSON-lines files; fix the --input paths")
    parent = os.path.dirname(os.path.abspath(model_prefix))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".spm-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_sentences(inputs, json_keys, max_sentences), model_prefix=tmp,
            vocab_size=vocab_size, model_type=model_type, character_coverage=character_coverage,
            byte_fallback=True, normalization_rule_name=normalization,
            remove_extra_whitespaces=False, max_sentence_length=_MAX_SENTENCE_BYTES,
            num_threads=threads or os.cpu_count() or 1, minloglevel=2)
    except RuntimeError as e:
        _cleanup(tmp)
        raise InputError(f"SentencePiece training on {', '.join(inputs)} failed: {e}; adjust "
                         f"--vocab-size (the message says which way) or --character-coverage, "
                         f"or give more text") from None
    for ext in (".model", ".vocab"):
        os.replace(tmp + ext, model_prefix + ext)
    log.info("trained a %s SentencePiece vocabulary of %d pieces: %s.model", model_type,
             vocab_size, model_prefix)
    return model_prefix + ".model"


def _cleanup(tmp: str) -> None:
    for ext in (".model", ".vocab"):
        if os.path.exists(tmp + ext):
            os.remove(tmp + ext)


__all__: List[str] = ["train_sentencepiece"]
