"""Tokenizers: GPT-2 byte-level BPE (hand-worked merges, and agreement with Hugging Face's
implementation), SentencePiece (training and round trip), Hugging Face tokenizer.json, null."""
import json
import pickle

import pytest

from tests.support.data import bytelevel_bpe, corpus_lines, spm_model
from megatron.config.errors import InputError
from megatron.data.tokenizers import TokenizerSpec, build_tokenizer
from megatron.data.tokenizers.gpt2_bpe import GPT2BPETokenizer, bytes_to_unicode, pretokenize

HARD_TEXTS = [
    "Hello world! It's 2024, isn't it?",
    "  leading spaces\n\n\ttabs and   runs   \n",
    "trailing spaces   ",
    "He said 'hello' -- x'S y'll z'VE",
    "naïve café — x² ≥ ½, ⅔ and ٣ and Ⅻ",
    "Emoji 🙂🙂 CJK 中文字符 Greek Ελληνικά",
    "astral letters 𝐀𝐁c and digits 𝟏𝟐3 and 🙂𝐀 mixed",
    "a\x1cb\x1fc\x85d\u00a0e\u2028f\u3000g",
    "numbers 1234567 3.14 -5 1e9",
    "!!!??? ... ,,, ;;; ___ $$$",
    "",
]


def test_bytes_to_unicode_is_a_printable_bijection():
    table = bytes_to_unicode()
    assert len(table) == 256 and len(set(table.values())) == 256
    assert table[ord("A")] == "A" and table[ord(" ")] == "\u0120"  # the familiar "Ġ"
    assert all(not c.isspace() and c.isprintable() for c in table.values())


def test_pretokenize_follows_the_gpt2_pattern():
    assert pretokenize("Hello world!  It's") == ["Hello", " world", "!", " ", " It", "'s"]
    # A whitespace run leaves its last character to the next word (a space joins it, a newline
    # stands alone); trailing whitespace stays one run.
    assert pretokenize("a   b\n\nc  ") == ["a", "  ", " b", "\n", "\n", "c", "  "]
    assert pretokenize("x²3 ½") == ["x", "²3", " ½"]  # ² and ½ are numbers, not letters
    assert pretokenize("it'LL") == ["it", "'", "LL"]  # contractions are lower-case only


def test_ascii_fast_path_agrees_with_the_unicode_pattern():
    from megatron.data.tokenizers.gpt2_bpe import gpt2_pattern
    for text in [t for t in HARD_TEXTS if t.isascii()] + ["a\x1cb\x0b c\x7f'll 'd"]:
        assert pretokenize(text) == gpt2_pattern().findall(text)


def _tiny_gpt2(tmp_path):
    """A hand-made vocabulary: merges h+e, l+l, he+ll, hell+o, Ġ+w, o+r, Ġw+or, Ġwor+ld."""
    enc = bytes_to_unicode()
    base = {c: i for i, c in enumerate(sorted(enc.values()))}
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("\u0120", "w"), ("o", "r"),
              ("\u0120w", "or"), ("\u0120wor", "l"), ("\u0120worl", "d")]
    vocab = dict(base)
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    lines = ["#version: 0.2"] + [f"{a} {b}" for a, b in merges]
    (tmp_path / "merges.txt").write_text("\n".join(lines))
    return GPT2BPETokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt")), vocab


def test_gpt2_bpe_hand_worked_merges(tmp_path):
    tok, vocab = _tiny_gpt2(tmp_path)
    assert tok.bpe("hello") == ["hello"]
    assert tok.bpe("\u0120world") == ["\u0120world"]
    # h+e, then both l+l, then he+ll once; "hell"+"ll" and "ll"+"o" are not merges
    assert tok.bpe("hellllo") == ["hell", "ll", "o"]
    assert tok.tokenize("hello world") == [vocab["hello"], vocab["\u0120world"]]
    assert tok.vocab_size == len(vocab) and tok.eod == vocab["<|endoftext|>"]
    for text in HARD_TEXTS:
        assert tok.detokenize(tok.tokenize(text)) == text


def test_gpt2_bpe_errors_name_the_setting(tmp_path):
    with pytest.raises(InputError, match=r"data.vocab_file=.*is not a file.*vocab.json"):
        GPT2BPETokenizer(str(tmp_path / "missing.json"), str(tmp_path / "m.txt"))
    (tmp_path / "v.json").write_text("{}")
    (tmp_path / "m.txt").write_text("a b c\n")
    with pytest.raises(InputError, match=r"m.txt:1 is 'a b c', expected two space-separated"):
        GPT2BPETokenizer(str(tmp_path / "v.json"), str(tmp_path / "m.txt"))


@pytest.fixture(scope="module")
def hf_bytelevel(tmp_path_factory):
    pytest.importorskip("tokenizers", reason="optional 'tokenizers' library "
                        "(pip install tokenizers) not installed")
    d = tmp_path_factory.mktemp("hf")
    return bytelevel_bpe(d, corpus_lines(1500, seed=3) + HARD_TEXTS), d


def test_gpt2_bpe_matches_hugging_face_byte_level_bpe(hf_bytelevel):
    hf, d = hf_bytelevel
    ours = GPT2BPETokenizer(str(d / "vocab.json"), str(d / "merges.txt"))
    for text in HARD_TEXTS + corpus_lines(200, seed=9):
        assert ours.tokenize(text) == hf.encode(text).ids, text
    assert ours.eod == hf.token_to_id("<|endoftext|>")


def test_huggingface_tokenizer_json(hf_bytelevel):
    hf, d = hf_bytelevel
    tok = build_tokenizer(TokenizerSpec("huggingface", str(d / "tokenizer.json")))
    assert tok.vocab_size == hf.get_vocab_size() and tok.eod == hf.token_to_id("<|endoftext|>")
    assert tok.tokenize("Hello world") == hf.encode("Hello world").ids
    assert tok.detokenize(tok.tokenize(HARD_TEXTS[0])) == HARD_TEXTS[0]
    assert pickle.loads(pickle.dumps(tok)).tokenize("abc") == tok.tokenize("abc")


def test_huggingface_bad_file(tmp_path):
    pytest.importorskip("tokenizers", reason="optional 'tokenizers' library not installed")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(InputError, match=r"data.tokenizer_model=.*is not a Hugging Face"):
        build_tokenizer(TokenizerSpec("huggingface", str(tmp_path)))


def test_sentencepiece_train_load_and_round_trip():
    tok = build_tokenizer(TokenizerSpec("sentencepiece", spm_model()))
    assert tok.vocab_size == 512 and tok.eod == 2  # unk 0, bos 1, eos 2
    for text in HARD_TEXTS + corpus_lines(50, seed=5):
        ids = tok.tokenize(text)
        assert all(0 <= i < 512 for i in ids)
        # identity normalization + byte fallback: any text comes back exactly
        assert tok.detokenize(ids) == text
    assert pickle.loads(pickle.dumps(tok)).tokenize("to be") == tok.tokenize("to be")


def test_sentencepiece_bad_model(tmp_path):
    with pytest.raises(InputError, match=r"tokenizer_model=None is not a file.*train-tokenizer"):
        build_tokenizer(TokenizerSpec("sentencepiece", None))
    (tmp_path / "x.model").write_bytes(b"garbage")
    with pytest.raises(InputError, match=r"is not a SentencePiece model"):
        build_tokenizer(TokenizerSpec("sentencepiece", str(tmp_path / "x.model")))


def test_null_tokenizer():
    tok = build_tokenizer(TokenizerSpec("null", vocab_size=100))
    assert tok.vocab_size == 100 and tok.eod == 99
    assert tok.tokenize("1 2  3\n4") == [1, 2, 3, 4] and tok.tokenize([5, 6]) == [5, 6]
    assert tok.detokenize([7, 8]) == "7 8"
    with pytest.raises(InputError, match=r"id 100 is outside .*\[0, 100\); raise model.vocab_size"):
        tok.tokenize("1 100")
    with pytest.raises(InputError, match=r"expects integers"):
        tok.tokenize("hello")
    with pytest.raises(InputError, match=r"model.vocab_size=None is invalid"):
        build_tokenizer(TokenizerSpec("null"))


def test_unknown_type_and_megatron_aliases():
    with pytest.raises(InputError, match=r"data.tokenizer_type='bert' is invalid: expected one of"):
        build_tokenizer(TokenizerSpec("bert"))
    assert build_tokenizer(TokenizerSpec("NullTokenizer", vocab_size=10)).vocab_size == 10


UNREAD = [(kind, key) for kind, reads in {"null": (), "sentencepiece": ("model",),
                                          "huggingface": ("model",),
                                          "gpt2": ("vocab_file", "merges_file")}.items()
          for key in ("model", "vocab_file", "merges_file") if key not in reads]


@pytest.mark.parametrize("kind, key", UNREAD)
def test_a_tokenizer_file_the_type_does_not_read_is_refused_naming_both(kind, key):
    """data.tokenizer_model with data.tokenizer_type=null (or a GPT-2 vocab with sentencepiece,
    ...) was ignored: the corpus was read with another tokenizer than the file named. Refused
    before any file is opened, under the config's names and megatron-preprocess's flags."""
    from megatron.data.tokenizers import CONFIG_NAMES, TokenizerSpec, build_tokenizer
    flags = {"type": "--tokenizer-type", "model": "--tokenizer-model",
             "vocab_file": "--vocab-file", "merges_file": "--merge-file",
             "vocab_size": "--vocab-size"}
    for names in (CONFIG_NAMES, flags):
        spec = TokenizerSpec(kind, vocab_size=64, names=names, **{key: "/no/such/file"})
        with pytest.raises(InputError) as refused:
            build_tokenizer(spec)
        text = str(refused.value)
        assert text.startswith(f"{names[key]}='/no/such/file' is set, but "
                               f"{names['type']}='{kind}' does not read it"), text
        assert f"or leave {names[key]} unset" in text


def test_preprocess_refuses_a_vocab_size_its_tokenizer_does_not_read(tmp_path, capsys):
    from megatron.cli.preprocess import main
    code = main(["--input", str(tmp_path / "in.jsonl"), "--output-prefix", str(tmp_path / "o"),
                 "--tokenizer-type", "sentencepiece", "--tokenizer-model", "m.model",
                 "--vocab-size", "100"])
    err = capsys.readouterr().err
    assert code == 2 and "--vocab-size=100 is set, but --tokenizer-type='sentencepiece' does " \
                         "not read it" in err, err


def test_a_synthetic_run_says_what_it_trains_on_and_what_it_leaves_unread():
    from megatron.config import load_config
    from megatron.training.startup import synthetic_note
    from tests.support.paths import TINY
    alone = synthetic_note(load_config(TINY))
    assert alone.startswith("data.synthetic=true: training on random token ids (vocabulary 512)")
    assert "not read" not in alone
    both = synthetic_note(load_config(TINY, ["data.paths=[a/b, 0.5 c/d]"]))
    assert both.endswith("data.paths (2 entries) is not read: set data.synthetic=false to train "
                         "on it")


def test_start_up_loads_a_tokenizer_file_once_and_a_rewritten_one_again(tmp_path, monkeypatch):
    """The trainer's start-up reads the vocabulary, the end-of-document id (the loss mask and
    the document mask) and the iterators' tokenizer: one load of the file, not three; a file
    rewritten since is loaded again, so a changed vocabulary is never answered from memory."""
    from megatron.config import load_config
    from megatron.data import tokenizer_vocab_size
    from megatron.data.tokenizers import eod_id, spec_from_config
    import megatron.data.tokenizers.gpt2_bpe as gpt2_bpe
    _, vocab = _tiny_gpt2(tmp_path)
    loads = []

    class Counted(GPT2BPETokenizer):
        def __init__(self, *args, **kw):
            loads.append(args[0])
            super().__init__(*args, **kw)
    monkeypatch.setattr(gpt2_bpe, "GPT2BPETokenizer", Counted)
    cfg = load_config(None, ["data.synthetic=false", "data.paths=[c]", "data.tokenizer_type=gpt2",
                             f"data.vocab_file={tmp_path / 'vocab.json'}",
                             f"data.merges_file={tmp_path / 'merges.txt'}"])
    assert tokenizer_vocab_size(cfg) == len(vocab)
    assert eod_id(cfg, "data.eod_mask_loss") == vocab["<|endoftext|>"]
    assert eod_id(cfg, "data.reset_attention_mask") == vocab["<|endoftext|>"]
    assert build_tokenizer(spec_from_config(cfg)).vocab_size == len(vocab)
    assert len(loads) == 1
    vocab["<|extra|>"] = len(vocab)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    assert tokenizer_vocab_size(cfg) == len(vocab) and len(loads) == 2
