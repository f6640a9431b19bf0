"""Any Hugging Face `tokenizer.json`, through the optional `tokenizers` library."""
from __future__ import annotations

import os
from typing import List, Optional, Sequence

from megatron.config.errors import InputError
from megatron.data.tokenizers.base import Tokenizer

# End-of-document tokens of common tokenizer.json files, tried in order.
EOD_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[SEP]")
# Beginning-of-document tokens (Llama 3's, Gemma's, Llama 2's and Mistral's, others'), in order.
BOS_CANDIDATES = ("<|begin_of_text|>", "<bos>", "<s>", "<|startoftext|>")


class HuggingFaceTokenizer(Tokenizer):
    name = "huggingface"

    def __init__(self, path: str, field_name: str = "data.tokenizer_model"):
        try:
            from tokenizers import Tokenizer as _HFTokenizer
        except ImportError:
            raise InputError(f"{field_name}={path!r} needs the optional 'tokenizers' library, "
                             f"which is not installed; fix: pip install 'megatron-frontier[hf]' "
                             f"(or pip install tokenizers)") from None
        if path and os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not path or not os.path.isfile(path):
            raise InputError(f"{field_name}={path!r} is not a file: expected a Hugging Face "
                             f"tokenizer.json (or a directory holding one); set {field_name}")
        self.path = path
        try:
            self._tok = _HFTokenizer.from_file(path)
        except Exception as e:  # the Rust side raises a bare Exception for any parse error
            raise InputError(f"{field_name}={path!r} is not a Hugging Face tokenizer.json ({e})"
                             f"; expected the file saved by tokenizers/transformers") from None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def _eod_id(self) -> Optional[int]:
        return self._first_of(EOD_CANDIDATES)

    def _bos_id(self) -> Optional[int]:
        return self._first_of(BOS_CANDIDATES)

    def _first_of(self, tokens: Sequence[str]) -> Optional[int]:
        for token in tokens:
            i = self._tok.token_to_id(token)
            if i is not None:
                return i
        return None

    def tokenize(self, text: str) -> List[int]:
        # No BOS/CLS from the post-processor: documents are joined by eod (--append-eod) and
        # begin with bos where asked (--prepend-bos).
        return self._tok.encode(text, add_special_tokens=False).ids

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def __getstate__(self):
        return {"path": self.path}

    def __setstate__(self, state):
        self.__init__(state["path"])
