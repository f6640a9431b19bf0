"""GPT-2 byte-level BPE from vocab.json and merges.txt.

Text is split into words by GPT-2's pattern, each word's UTF-8 bytes are mapped to printable
characters (so every byte string is a string over a 256-symbol alphabet and nothing is ever
unknown), and each word is merged by the ranked merge list, lowest rank first."""
from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Tuple

from megatron.config.errors import InputError
from megatron.data.tokenizers.base import Tokenizer

EOD_TOKEN = "<|endoftext|>"
_INF = float("inf")
# Words repeat heavily in natural text; caching their merges is most of the speed.
_CACHE_LIMIT = 1 << 17


def bytes_to_unicode() -> Dict[int, str]:
    """Byte -> character. Printable Latin-1 bytes map to themselves; the other 68 bytes map to
    code points from 256 up, in byte order, so merges.txt never has to hold whitespace or
    control characters."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
                 + list(range(ord("\xae"), ord("\xff") + 1)))
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _char_class(chars: List[str]) -> str:
    """A regex character class body of ranges covering `chars` (sorted code points)."""
    parts, i = [], 0
    while i < len(chars):
        j = i
        while j + 1 < len(chars) and ord(chars[j + 1]) == ord(chars[j]) + 1:
            j += 1
        lo, hi = re.escape(chars[i]), re.escape(chars[j])
        parts.append(lo if i == j else f"{lo}-{hi}")
        i = j + 1
    return "".join(parts)


# Unicode White_Space, which is what \s means in the regex engines GPT-2 and Hugging Face use;
# Python's \s also matches U+001C..U+001F, which GPT-2 treats as symbols.
_WHITESPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
               "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?{L}+| ?{N}+| ?{O}+|[{W}]+(?![^{W}])|[{W}]+"
# Most text is ASCII, where the classes are short and matching is fastest.
_ASCII = re.compile(_SPLIT.format(L="[A-Za-z]", N="[0-9]", O="[^\\sA-Za-z0-9]", W="\\s"),
                    re.ASCII)
_ASTRAL = "\U00010000-\U0010ffff"


def _bmp_or_astral(chars: List[str]) -> str:
    """A class as "BMP part, or astral part": the regex engine scans the ranges above U+FFFF
    one by one, so they are only tried for a character that is astral itself."""
    bmp = _char_class([c for c in chars if ord(c) < 0x10000])
    astral = _char_class([c for c in chars if ord(c) >= 0x10000])
    return f"(?:[{bmp}]|(?=[{_ASTRAL}])[{astral}])"


@lru_cache(maxsize=1)
def gpt2_pattern() -> "re.Pattern[str]":
    """GPT-2's split pattern
        's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
    for the standard library `re`, which lacks \\p{..}: the letter and number classes are spelled
    out from Python's Unicode tables (no letter or number lies above U+3FFFF)."""
    everything = "".join(map(chr, range(0x40000)))
    word_chars = re.findall(r"[^\W\d_]", everything)  # letters plus non-decimal numbers
    letters = [c for c in word_chars if c.isalpha()]
    numbers = sorted(re.findall(r"\d", everything) + [c for c in word_chars if not c.isalpha()],
                     key=ord)
    ws = _char_class(sorted(_WHITESPACE, key=ord))
    bmp_ln = _char_class(sorted((c for c in letters + numbers if ord(c) < 0x10000), key=ord))
    astral_ln = _char_class(sorted((c for c in letters + numbers if ord(c) >= 0x10000), key=ord))
    other = (f"(?:[^{ws}{bmp_ln}{_ASTRAL}]|(?=[{_ASTRAL}])(?![{astral_ln}])[{_ASTRAL}])")
    return re.compile(_SPLIT.format(L=_bmp_or_astral(letters), N=_bmp_or_astral(numbers),
                                    O=other, W=ws))


def pretokenize(text: str) -> List[str]:
    return (_ASCII if text.isascii() else gpt2_pattern()).findall(text)


def _read_vocab(path: str, name: str) -> Dict[str, int]:
    if not path or not os.path.isfile(path):
        raise InputError(f"{name}={path!r} is not a file: expected the GPT-2 vocab.json; set "
                         f"{name}")
    try:
        with open(path, encoding="utf-8") as f:
            vocab = json.load(f)
    except ValueError as e:
        raise InputError(f"{name}={path!r} is not valid JSON ({e}); expected vocab.json mapping "
                         f"tokens to ids") from None
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise InputError(f"{name}={path!r} is not a token -> id mapping; expected vocab.json")
    return vocab


def _read_merges(path: str, name: str) -> Dict[Tuple[str, str], int]:
    if not path or not os.path.isfile(path):
        raise InputError(f"{name}={path!r} is not a file: expected the GPT-2 merges.txt; set "
                         f"{name}")
    ranks: Dict[Tuple[str, str], int] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            line = line.rstrip("\n")
            if not line or (number == 1 and line.startswith("#version")):
                continue
            pair = line.split(" ")
            if len(pair) != 2:
                raise InputError(f"{path}:{number} is {line!r}, expected two space-separated "
                                 f"symbols (a merges.txt line)")
            ranks.setdefault((pair[0], pair[1]), len(ranks))
    return ranks


class GPT2BPETokenizer(Tokenizer):
    name = "gpt2"

    def __init__(self, vocab_file: str, merges_file: str, vocab_name: str = "data.vocab_file",
                 merges_name: str = "data.merges_file"):
        self.encoder = _read_vocab(vocab_file, vocab_name)
        self.decoder = {i: t for t, i in self.encoder.items()}
        self.ranks = _read_merges(merges_file, merges_name)
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        self._cache: Dict[str, List[int]] = {}
        self._source = vocab_file

    @property
    def vocab_size(self) -> int:
        return len(self.encoder)

    def _eod_id(self) -> Optional[int]:
        return self.encoder.get(EOD_TOKEN)

    def bpe(self, word: str) -> List[str]:
        """Merge a byte-mapped word: repeatedly join every occurrence of the best-ranked pair."""
        symbols = list(word)
        while len(symbols) > 1:
            pairs = [(self.ranks.get(p, _INF), p) for p in zip(symbols, symbols[1:])]
            rank, best = min(pairs, key=lambda rp: rp[0])
            if rank == _INF:
                break
            merged, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        return symbols

    def _word_ids(self, word: str) -> List[int]:
        ids = self._cache.get(word)
        if ids is None:
            mapped = "".join(self.byte_encoder[b] for b in word.encode("utf-8"))
            try:
                ids = [self.encoder[t] for t in self.bpe(mapped)]
            except KeyError as e:
                raise InputError(f"BPE token {e.args[0]!r} is missing from {self._source}: "
                                 f"expected vocab.json and merges.txt of the same tokenizer")
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[word] = ids
        return ids

    def tokenize(self, text: str) -> List[int]:
        out: List[int] = []
        for word in pretokenize(text):
            out.extend(self._word_ids(word))
        return out

    def detokenize(self, ids: Sequence[int]) -> str:
        text = "".join(self.decoder[int(i)] for i in ids)
        return bytes(self.byte_decoder[c] for c in text).decode("utf-8", errors="replace")
