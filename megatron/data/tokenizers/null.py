"""The null tokenizer, for data that is already token ids.

Text is whitespace-separated integers (or a JSON list of integers in preprocessing input). The
vocabulary size comes from the config (model.vocab_size) and the end-of-document id is its last
id, vocab_size - 1, so every id stays inside the vocabulary the model is built with."""
from __future__ import annotations

from typing import List, Sequence, Union

from megatron.config.errors import InputError
from megatron.data.tokenizers.base import Tokenizer


class NullTokenizer(Tokenizer):
    name = "null"

    def __init__(self, vocab_size: int, size_name: str = "model.vocab_size"):
        if vocab_size is None or int(vocab_size) < 2:
            raise InputError(f"{size_name}={vocab_size!r} is invalid for the null tokenizer: "
                             f"expected the vocabulary size of the pre-tokenized data (at least 2)"
                             f"; set {size_name}")
        self._size = int(vocab_size)
        self._size_name = size_name

    @property
    def vocab_size(self) -> int:
        return self._size

    def _eod_id(self) -> int:
        return self._size - 1

    def tokenize(self, text: Union[str, Sequence[int]]) -> List[int]:
        try:
            ids = [int(t) for t in (text.split() if isinstance(text, str) else text)]
        except (TypeError, ValueError):
            raise InputError(f"the null tokenizer expects integers separated by spaces (or a list "
                             f"of integers), got {str(text)[:60]!r}; use a text tokenizer for "
                             f"raw text") from None
        bad = [t for t in ids if not 0 <= t < self._size]
        if bad:
            raise InputError(f"token id {bad[0]} is outside the null tokenizer's vocabulary "
                             f"[0, {self._size}); raise {self._size_name}")
        return ids

    def detokenize(self, ids: Sequence[int]) -> str:
        return " ".join(str(int(i)) for i in ids)
