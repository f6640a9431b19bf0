"""megatron-preprocess writes what Megatron-LM's tools/preprocess_data.py writes, byte for byte:
a list in the text field is one sequence per non-empty element inside one document, --append-eod
ends the document's last sequence, a document without tokens is kept as an empty document (a
document-index entry and no sequence), and tokens are uint16 below 65500 ids, else int32;
--prepend-bos (beyond Megatron-LM's script) begins each non-empty document with the bos token. The
expected files come from the independent spec writer fed with Megatron-LM's rules. Then the GPT
data pipeline reads such a file: splits over sequences (as Megatron's GPT dataset) and samples
that walk the shuffled sequence stream across empty and multi-sequence documents. The command's
own report is tests/integration/test_data_megatron_preprocess_cli.py."""
import os

import numpy as np
import pytest

from tests.support.data import ROWS, spec_read, spec_write, spm_model, write_rows
from megatron.config import load_config
from megatron.config.errors import InputError
from megatron.data import build_iterators
from megatron.data.gpt_dataset import build_split
from megatron.data.index_math import split_ranges
from megatron.data.indexed_dataset import IndexedDataset
from megatron.data.preprocess import PreprocessJob, preprocess
from megatron.data.tokenizers import TokenizerSpec, build_tokenizer

def _megatron_documents(eod):
    """ROWS as Megatron-LM's Encoder.encode turns them into sequences (eod on the last one)."""
    docs = [[[1, 2, 3]], [[4, 5], [6]], [], [], [[7, 8], [9]], [[10, 11]], [], [[12]]]
    if eod is not None:
        for doc in docs:
            if doc:
                doc[-1] = doc[-1] + [eod]
    return docs


def _run(tmp_path, rows, spec, append_eod=False, workers=1, name="out"):
    src = write_rows(tmp_path / f"{name}.jsonl", rows)
    job = PreprocessJob([src], str(tmp_path / name), spec, ("text",), append_eod, workers)
    (prefix,), stats = preprocess(job, progress=lambda s: None)
    return prefix, stats


def _assert_same_bytes(ours: str, reference: str):
    for ext in (".idx", ".bin"):
        with open(ours + ext, "rb") as a, open(reference + ext, "rb") as b:
            assert a.read() == b.read(), f"{ext} differs from Megatron-LM's layout"


@pytest.mark.parametrize("append_eod", [False, True])
def test_lists_and_empty_documents_byte_for_byte(tmp_path, append_eod):
    prefix, stats = _run(tmp_path, ROWS, TokenizerSpec("null", vocab_size=200), append_eod)
    docs = _megatron_documents(199 if append_eod else None)
    spec_write(str(tmp_path / "ref"), 8, docs)  # uint16
    _assert_same_bytes(prefix, str(tmp_path / "ref"))
    got = spec_read(prefix)
    assert got["doc_index"] == [0, 1, 3, 3, 3, 5, 6, 6, 7]
    assert stats.documents == len(ROWS) and stats.empty == 3


def test_large_vocabulary_is_int32(tmp_path):
    prefix, _ = _run(tmp_path, ROWS, TokenizerSpec("null", vocab_size=65500), True)
    spec_write(str(tmp_path / "ref"), 4, _megatron_documents(65499))  # int32
    _assert_same_bytes(prefix, str(tmp_path / "ref"))
    assert IndexedDataset(prefix).dtype == np.int32


def test_two_workers_write_the_same_bytes(tmp_path):
    one, _ = _run(tmp_path, ROWS * 20, TokenizerSpec("null", vocab_size=200), True, 1, "one")
    two, _ = _run(tmp_path, ROWS * 20, TokenizerSpec("null", vocab_size=200), True, 2, "two")
    _assert_same_bytes(one, two)


def test_a_list_of_texts_is_one_sequence_each(tmp_path):
    spec = TokenizerSpec("sentencepiece", spm_model())
    sentences = ["The king and queen of denmark.", "", "Friends, romans, countrymen!"]
    prefix, _ = _run(tmp_path, [{"text": sentences}, {"text": "To be or not."}], spec, True)
    tok = build_tokenizer(spec)
    got = spec_read(prefix)
    assert got["sequences"] == [tok.tokenize(sentences[0]), tok.tokenize(sentences[2]) + [tok.eod],
                                tok.tokenize("To be or not.") + [tok.eod]]
    assert got["doc_index"] == [0, 2, 3] and got["code"] == 8


@pytest.mark.parametrize("rows, spec, fragment", [
    ([{"text": ["ok", {"a": 1}]}], TokenizerSpec("null", vocab_size=200), "expected a text or "
     "a list of texts (one sequence each), or token ids"),
    ([{"text": [1, 2]}], TokenizerSpec("sentencepiece", spm_model()), "expected a text or a "
     "list of texts (one sequence each); fix"),
    ([{"text": 5}], TokenizerSpec("null", vocab_size=200), "holds '5', expected a text"),
    # the tokenizer's own refusals named no line before
    ([{"text": "1 x"}], TokenizerSpec("null", vocab_size=200), "the null tokenizer expects "
     "integers"),
    ([{"text": "1 999"}], TokenizerSpec("null", vocab_size=200), "token id 999 is outside"),
])
def test_values_that_are_not_texts_are_one_message(tmp_path, rows, spec, fragment):
    with pytest.raises(InputError) as e:
        _run(tmp_path, rows, spec)
    assert f"{tmp_path / 'out.jsonl'}:1: key 'text'" in str(e.value)
    assert fragment in str(e.value)


# ---- the GPT data pipeline over empty and multi-sequence documents --------------------------

def _corpus(tmp_path):
    """30 documents: every fifth empty, every third of the rest three sentences. Sequence k
    holds tokens 100 * k + j, so every token names its sequence."""
    rng = np.random.default_rng(3)
    rows, k = [], 0
    for i in range(30):
        if i % 5 == 3:
            rows.append({"text": "" if i % 2 else []})
            continue
        sentences = []
        for _ in range(3 if i % 3 == 0 else 1):
            sentences.append(" ".join(str(100 * k + j) for j in range(int(rng.integers(3, 20)))))
            k += 1
        rows.append({"text": sentences if len(sentences) > 1 else sentences[0]})
    prefix, _ = _run(tmp_path, rows, TokenizerSpec("null", vocab_size=5000), name="corpus")
    return prefix, k


def test_splits_are_over_sequences_as_in_megatron(tmp_path):
    prefix, sequences = _corpus(tmp_path)
    ds = IndexedDataset(prefix)
    assert len(ds) == sequences and ds.num_documents == 30
    (t0, t1), (v0, v1), _ = split_ranges("80,20,0", len(ds))
    train = build_split("train", [ds], [1.0], "80,20,0", 200, 8, 1, str(tmp_path / "cache"))
    valid = build_split("valid", [ds], [1.0], "80,20,0", 50, 8, 1, str(tmp_path / "cache"))
    assert sorted(set(train.doc_idx.tolist())) == list(range(t0, t1))
    assert sorted(set(valid.doc_idx.tolist())) == list(range(v0, v1))
    stream = np.concatenate([ds.get(int(s)) for s in train.doc_idx]).astype(np.int64)
    for i in range(len(train)):
        s = int(train.shuffle_idx[i])
        np.testing.assert_array_equal(train[i], stream[s * 8:s * 8 + 9])
    assert {int(t) // 100 for i in range(len(valid)) for t in valid[i]} <= set(range(v0, v1))


def test_training_iterators_read_such_a_file(tmp_path):
    prefix, sequences = _corpus(tmp_path)
    sets = {"data.synthetic": "false", "data.paths": f'["{prefix}"]', "data.split": "80,20,0",
            "data.cache_dir": str(tmp_path / "cache"), "model.vocab_size": "5000",
            "model.seq_length": "8", "training.micro_batch_size": "2",
            "training.global_batch_size": "4", "training.train_iters": "30",
            "training.eval_iters": "2"}
    it = build_iterators(load_config(None, [f"{k}={v}" for k, v in sets.items()]), 0, 1, 0)
    (t0, t1), (v0, v1), _ = split_ranges("80,20,0", sequences)
    seen = set()
    for _ in range(60):  # 30 steps of 2 micro-batches: several epochs of the train split
        tokens, labels = next(it.train)
        assert tokens.shape == (2, 8) and bool((tokens[:, 1:] == labels[:, :-1]).all())
        seen |= {int(t) // 100 for t in tokens.flatten()}
    assert seen == set(range(t0, t1))  # every train sequence, nothing else
    batches = it.valid()  # endless: evaluation takes training.eval_iters batches of it
    valid = {int(t) // 100 for _ in range(4) for t in next(batches)[0].flatten()}
    assert valid and valid <= set(range(v0, v1))


@pytest.mark.parametrize("prefix", [".", "..", "data/", "data", "taken/corpus", ""])
def test_an_output_prefix_that_is_a_folder_is_refused(tmp_path, monkeypatch, capsys, prefix):
    """'.' wrote hidden files ._text_document.bin, 'data/' wrote data/_text_document.bin (and
    merge data/.bin), a prefix under a file raised a bare 'File exists': every prefix flag of
    the three subcommands names files in a folder that is or can be made, checked before any
    input is read (the inputs named here do not exist)."""
    from megatron.cli import preprocess as cli
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "taken").write_text("")
    expected = {"": "the path is empty",
                "taken/corpus": "'taken/corpus' lies inside the file "
                                f"{str(tmp_path / 'taken')!r}, where a directory is needed"}
    for argv, flag in ((["--input", "a", "--tokenizer-type", "null"], "--output-prefix"),
                       (["merge", "--inputs", "a"], "--output-prefix"),
                       (["train-tokenizer", "--input", "a"], "--model-prefix")):
        assert cli.main([*argv, flag, prefix]) == 2
        err = capsys.readouterr().err
        message = expected.get(prefix, f"{prefix!r} names a directory: expected the start of "
                                       "the output files' names to write; add a name, e.g. ")
        assert f"megatron-preprocess: error: {flag}: " in err and message in err, err
    assert sorted(os.listdir(tmp_path)) == ["data", "taken"] and not os.listdir("data")


def _word_level_json(tmp_path) -> str:
    """A Hugging Face tokenizer.json of whole words with Gemma's <bos> and <eos>."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"<bos>": 0, "<eos>": 1, "[UNK]": 2, "a": 3, "b": 4}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = str(tmp_path / "tokenizer.json")
    tok.save(path)
    return path


@pytest.mark.parametrize("workers", [1, 2])
def test_prepend_bos_begins_each_document_with_it(tmp_path, workers):
    """--prepend-bos (Llama 3's and Gemma's documents begin with their bos token): before the
    first sequence of each document, the eod after its last; an empty document stays empty."""
    spec = TokenizerSpec("huggingface", _word_level_json(tmp_path))
    rows = [{"text": "a b"}, {"text": ""}, {"text": ["b", "", "a a"]}]
    src = write_rows(tmp_path / "in.jsonl", rows)
    job = PreprocessJob([src], str(tmp_path / "out"), spec, ("text",), True, workers,
                        prepend_bos=True)
    (prefix,), stats = preprocess(job, progress=lambda s: None)
    spec_write(str(tmp_path / "ref"), 8, [[[0, 3, 4, 1]], [], [[0, 4], [3, 3, 1]]])
    _assert_same_bytes(prefix, str(tmp_path / "ref"))
    assert stats.empty == 1


def test_a_sentencepiece_models_bos_begins_each_document(tmp_path):
    spm = spm_model()
    tok = build_tokenizer(TokenizerSpec("sentencepiece", spm))
    src = write_rows(tmp_path / "in.jsonl", [{"text": "the play"}, {"text": "a king"}])
    job = PreprocessJob([src], str(tmp_path / "out"), TokenizerSpec("sentencepiece", spm),
                        ("text",), prepend_bos=True)
    (prefix,), _ = preprocess(job, progress=lambda s: None)
    got = spec_read(prefix)
    starts = got["doc_index"][:-1]
    assert tok.bos == 1 and [got["sequences"][i][0] for i in starts] == [1, 1]
    assert [got["sequences"][i][1:] for i in starts] == [tok.tokenize("the play"),
                                                         tok.tokenize("a king")]


def test_prepend_bos_without_a_bos_token_is_one_message(tmp_path):
    """The null tokenizer (token ids) has no bos: refused before any worker starts, naming the
    flag."""
    src = write_rows(tmp_path / "in.jsonl", ROWS[:1])
    job = PreprocessJob([src], str(tmp_path / "out"), TokenizerSpec("null", vocab_size=200),
                        ("text",), prepend_bos=True)
    with pytest.raises(InputError, match="the null tokenizer has no beginning-of-document "
                                         "token.*without --prepend-bos"):
        preprocess(job, progress=lambda s: None)
