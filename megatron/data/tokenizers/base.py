"""The interface every tokenizer implements, and the description that rebuilds one anywhere.

A TokenizerSpec is plain data (picklable), so preprocessing workers and data-parallel ranks each
build their own tokenizer from it instead of shipping a native object between processes."""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from megatron.config.errors import InputError

# The names of the settings in the config; the preprocess CLI passes its flag names instead, so
# every error names what the user actually typed.
CONFIG_NAMES = {"type": "data.tokenizer_type", "model": "data.tokenizer_model",
                "vocab_file": "data.vocab_file", "merges_file": "data.merges_file",
                "vocab_size": "model.vocab_size"}


@dataclass(frozen=True)
class TokenizerSpec:
    type: str  # sentencepiece | gpt2 | huggingface | null
    model: Optional[str] = None  # SentencePiece .model or Hugging Face tokenizer.json
    vocab_file: Optional[str] = None  # GPT-2 vocab.json
    merges_file: Optional[str] = None  # GPT-2 merges.txt
    vocab_size: Optional[int] = None  # null tokenizer only
    names: Dict[str, str] = field(default_factory=lambda: dict(CONFIG_NAMES), compare=False)


class Tokenizer(abc.ABC):
    """Text <-> token ids. `vocab_size` is unpadded; the model pads it (see data/vocab.py)."""

    name: str = "tokenizer"

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        ...

    @property
    def eod(self) -> int:
        """The end-of-document id appended between documents (--append-eod)."""
        return self._special(self._eod_id(), "end-of-document", "an eos/end-of-text",
                             "--append-eod")

    def _eod_id(self) -> Optional[int]:
        return None

    @property
    def bos(self) -> int:
        """The beginning-of-document id put before each document (--prepend-bos)."""
        return self._special(self._bos_id(), "beginning-of-document", "a bos/begin-of-text",
                             "--prepend-bos")

    def _special(self, found: Optional[int], what: str, kind: str, flag: str) -> int:
        """`found`, or one message naming the token the tokenizer lacks and the flag asking."""
        if found is None:
            raise InputError(f"the {self.name} tokenizer has no {what} token: expected {kind} "
                             f"token in its vocabulary; preprocess without {flag} or use a "
                             f"tokenizer that defines one")
        return found

    def _bos_id(self) -> Optional[int]:
        return None

    @abc.abstractmethod
    def tokenize(self, text: str) -> List[int]:
        ...

    @abc.abstractmethod
    def detokenize(self, ids: Sequence[int]) -> str:
        ...
