"""The data section: the corpus, its split and tokenizer, and the sample index (data/)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Literal, Optional

from megatron.config.errors import ConfigError
from megatron.config.sections.checks import check_choices, written_out


def split_fractions(text: str) -> List[float]:
    """data.split '969,30,1' (or '90/5/5', or '1') -> train, valid, test fractions summing to 1."""
    sep = "," if "," in str(text) else "/"
    try:
        parts = [float(p) for p in str(text).split(sep)]
    except ValueError:
        parts = []
    if not 1 <= len(parts) <= 3 or any(p < 0 for p in parts) or sum(parts) <= 0:
        raise ConfigError("data.split", text, "up to three non-negative weights for train, "
                          "valid and test, such as 969,30,1")
    parts += [0.0] * (3 - len(parts))
    return [p / sum(parts) for p in parts]


@dataclass
class DataConfig:
    synthetic: bool = True
    """Train on a generated token stream (throughput work without data); false: read paths."""
    paths: List[str] = field(default_factory=list)
    """The blend: a list of "WEIGHT PREFIX" strings or plain prefixes (equal weights). A prefix
    names PREFIX.bin and PREFIX.idx in the Megatron MMIDIDX format (megatron-preprocess)."""
    split: str = "969,30,1"
    """Train/valid/test shares of each dataset's sequences (Megatron's GPT split; a document is
    one sequence unless preprocessed from a list of texts): "969,30,1", "90/5/5" or "1"."""
    tokenizer_type: Literal["sentencepiece", "gpt2", "huggingface", "null"] = "null"
    """The tokenizer the corpus was preprocessed with. null: pre-tokenized data whose vocabulary
    is model.vocab_size (its last id is end-of-document)."""
    tokenizer_model: Optional[str] = None
    """A SentencePiece .model, or a Hugging Face tokenizer.json."""
    vocab_file: Optional[str] = None
    """GPT-2 vocab.json."""
    merges_file: Optional[str] = None
    """GPT-2 merges.txt."""
    cache_dir: Optional[str] = None
    """Where sample indices are cached, a folder all nodes share. null: next to each dataset."""
    seed: int = 1234
    """Seed of the document and sample shuffles, in [0, 2**32)."""
    eod_mask_loss: bool = False
    """Leave out of the loss every prediction made from an end-of-document token: the next
    document's first token, which nothing of its own document precedes (Megatron's
    --eod-mask-loss). The loss is then each micro-batch's mean over the predictions left. The
    id is the tokenizer's end-of-document; model.vocab_size - 1 under synthetic data and the
    null tokenizer."""
    reset_attention_mask: bool = False
    """Attend within documents only: a token sees the earlier tokens of its own document, up to
    and with the end-of-document before it (Megatron's --reset-attention-mask). Positions stay
    those of the sequence. The end-of-document id is data.eod_mask_loss's. Runs under every
    pipeline schedule and context-parallel algorithm, with a core that takes a mask (sdpa,
    math; auto picks one)."""
    reset_position_ids: bool = False
    """Positions restart at 0 after each end-of-document, so a document packed into a sequence
    gets the positions it would get alone, learned or rotary (Megatron's --reset-position-ids;
    with data.reset_attention_mask, a packed document is trained as if alone). The
    end-of-document id is data.eod_mask_loss's. Runs under every pipeline schedule and
    context-parallel algorithm."""
    index_impl: Literal["auto", "cpp", "numpy"] = "auto"
    """Who builds the sample index: cpp, the helper built ahead of time; numpy, its bit-identical
    reference; auto: cpp where it was built."""

    @property
    def document_setting(self) -> Optional[str]:
        """The setting that makes the model read each micro-batch's documents
        (data.reset_attention_mask, else data.reset_position_ids), or None when neither is
        set: what the end-of-document id is read for and what errors about documents name."""
        for name in ("reset_attention_mask", "reset_position_ids"):
            if getattr(self, name):
                return f"data.{name}"
        return None

    def __post_init__(self):
        check_choices("data", self)
        split_fractions(self.split)
        for name in ("paths", "tokenizer_model", "vocab_file", "merges_file", "cache_dir"):
            written_out("data", name, getattr(self, name))
        if not 0 <= self.seed < 2 ** 32:  # numpy's RandomState shuffles the documents
            raise ConfigError("data.seed", self.seed, "an integer in [0, 2**32)")
        if not self.synthetic and not self.paths:
            raise ConfigError("data.paths", self.paths,
                              "at least one dataset prefix when data.synthetic=false "
                              "(or set data.synthetic=true)")
