"""SentencePiece models (.model files), as trained by `megatron-preprocess train-tokenizer` or
shipped with Llama-style checkpoints."""
from __future__ import annotations

import os
from typing import List, Optional, Sequence

from megatron.config.errors import InputError
from megatron.data.tokenizers.base import Tokenizer


class SentencePieceTokenizer(Tokenizer):
    name = "sentencepiece"

    def __init__(self, model_path: str, field_name: str = "data.tokenizer_model"):
        import sentencepiece as spm

        if not model_path or not os.path.isfile(model_path):
            raise InputError(f"{field_name}={model_path!r} is not a file: expected a SentencePiece "
                             f".model; set {field_name}, or train one with "
                             f"`megatron-preprocess train-tokenizer`")
        self.model_path = model_path
        try:
            self._sp = spm.SentencePieceProcessor(model_file=model_path)
        except (RuntimeError, OSError) as e:
            raise InputError(f"{field_name}={model_path!r} is not a SentencePiece model ({e}); "
                             f"expected a .model file written by sentencepiece") from None

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def _eod_id(self) -> Optional[int]:
        eos = self._sp.eos_id()
        return eos if eos >= 0 else None

    def _bos_id(self) -> Optional[int]:
        bos = self._sp.bos_id()
        return bos if bos >= 0 else None

    def tokenize(self, text: str) -> List[int]:
        return self._sp.encode(text)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._sp.decode([int(i) for i in ids])

    def __getstate__(self):
        # The native processor does not pickle; the path rebuilds it.
        return {"model_path": self.model_path}

    def __setstate__(self, state):
        self.__init__(state["model_path"])
