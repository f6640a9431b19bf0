"""Tokenizers behind one interface: SentencePiece, GPT-2 byte-level BPE, Hugging Face
tokenizer.json, and the null tokenizer for pre-tokenized data."""
from __future__ import annotations

import os
from typing import Dict, Tuple

from megatron.config.errors import InputError
from megatron.data.tokenizers.base import CONFIG_NAMES, Tokenizer, TokenizerSpec

TYPES = ("sentencepiece", "gpt2", "huggingface", "null")
# Megatron-LM's --tokenizer-type names, accepted so existing preprocessing commands keep working.
ALIASES = {"SentencePieceTokenizer": "sentencepiece", "GPTSentencePieceTokenizer": "sentencepiece",
           "GPT2BPETokenizer": "gpt2", "HuggingFaceTokenizer": "huggingface",
           "NullTokenizer": "null"}


def canonical_type(name: str) -> str:
    return ALIASES.get(name, name)


# The files each type reads; one given to a type that does not read it is refused, not ignored.
READS = {"sentencepiece": ("model",), "huggingface": ("model",),
         "gpt2": ("vocab_file", "merges_file"), "null": ()}
_FIX = {"model": "sentencepiece (a .model) or huggingface (a tokenizer.json)",
        "vocab_file": "gpt2 (with its merges file)", "merges_file": "gpt2 (with its vocab file)"}


# Tokenizers already loaded in this process, by spec and the state of its files: a trainer's
# start-up asks for the vocabulary, the end-of-document id and the iterators' tokenizer, and a
# large BPE or SentencePiece file takes seconds to load each time. A file rewritten since (its
# size or modification time changed) is loaded again.
_LOADED: Dict[Tuple, Tokenizer] = {}
_KEEP = 4


def _files_key(spec: TokenizerSpec) -> Tuple:
    def state(path):
        try:
            st = os.stat(path)
        except OSError:
            return None  # loading names the missing file
        return os.path.realpath(path), st.st_size, st.st_mtime_ns
    return tuple(state(p) if p else None for p in (spec.model, spec.vocab_file, spec.merges_file))


def build_tokenizer(spec: TokenizerSpec) -> Tokenizer:
    """The tokenizer a spec describes; a missing or wrong file raises InputError naming the
    setting (spec.names) that points at it, and so does a file the type would not read.
    Loaded once per process while its files are unchanged (_LOADED)."""
    key = (spec, tuple(sorted(spec.names.items())), _files_key(spec))
    if key not in _LOADED:
        tokenizer = _load(spec)
        if len(_LOADED) >= _KEEP:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = tokenizer
    return _LOADED[key]


def _load(spec: TokenizerSpec) -> Tokenizer:
    kind, names = canonical_type(spec.type), spec.names
    for key in ("model", "vocab_file", "merges_file"):
        value = getattr(spec, key)
        if value and kind in READS and key not in READS[kind]:
            raise InputError(f"{names[key]}={value!r} is set, but {names['type']}={spec.type!r} "
                             f"does not read it (the corpus would be read with another tokenizer "
                             f"than that file's): set {names['type']} to {_FIX[key]}, or leave "
                             f"{names[key]} unset")
    if kind == "sentencepiece":
        from megatron.data.tokenizers.sentencepiece import SentencePieceTokenizer
        return SentencePieceTokenizer(spec.model, names["model"])
    if kind == "gpt2":
        from megatron.data.tokenizers.gpt2_bpe import GPT2BPETokenizer
        return GPT2BPETokenizer(spec.vocab_file, spec.merges_file, names["vocab_file"],
                                names["merges_file"])
    if kind == "huggingface":
        from megatron.data.tokenizers.huggingface import HuggingFaceTokenizer
        return HuggingFaceTokenizer(spec.model, names["model"])
    if kind == "null":
        from megatron.data.tokenizers.null import NullTokenizer
        return NullTokenizer(spec.vocab_size, names["vocab_size"])
    raise InputError(f"{names['type']}={spec.type!r} is invalid: expected one of "
                     f"{', '.join(TYPES)}")


def spec_from_config(cfg) -> TokenizerSpec:
    """The tokenizer of a training config (data section; model.vocab_size for null)."""
    d = cfg.data
    return TokenizerSpec(d.tokenizer_type, d.tokenizer_model, d.vocab_file, d.merges_file,
                         cfg.model.vocab_size, dict(CONFIG_NAMES))


def eod_of(tokenizer, setting: str) -> int:
    """The tokenizer's end-of-document id, for the setting that reads it (data.eod_mask_loss,
    data.reset_attention_mask); a tokenizer without one is refused naming the setting."""
    try:
        return tokenizer.eod
    except InputError as e:
        raise InputError(f"{setting}=true reads the end-of-document id, but {e}; or set "
                         f"{setting}=false") from None


def eod_id(cfg, setting: str) -> int:
    """The end-of-document id of a training config: model.vocab_size - 1 for synthetic data
    (the null tokenizer's), else its tokenizer's (eod_of)."""
    if cfg.data.synthetic:
        return cfg.model.vocab_size - 1
    return eod_of(build_tokenizer(spec_from_config(cfg)), setting)


__all__ = ["ALIASES", "TYPES", "Tokenizer", "TokenizerSpec", "build_tokenizer", "canonical_type",
           "eod_id", "eod_of", "spec_from_config"]
