"""Checkpoint folders made by hand for the tests of the commit protocol and the job chain: a
complete meta.json record (base/records.py) around whatever files a test writes."""
from megatron.base.records import CheckpointMeta, DataRecord, LayoutRecord, OptimizerRecord


def layout(tp=1, pp=1, dp=1, zero=0, padded_vocab=512, vocab=500, model=None) -> LayoutRecord:
    return LayoutRecord(tp, pp, dp, zero, padded_vocab, vocab, dict(model or {}))


def meta_json(step: int, files: dict, layout_record: LayoutRecord = None) -> dict:
    """meta.json of a checkpoint of `step` whose files are `files` (name -> size)."""
    return CheckpointMeta(step=step, consumed_samples=8 * step,
                          layout=layout_record or layout(), saved_at=0.0,
                          optimizer=OptimizerRecord({}, step, {}), files=files,
                          data=DATA).to_json()


DATA = DataRecord(seq_length=64, synthetic=True, paths=[], split="969,30,1",
                  tokenizer_type="null", tokenizer_model=None, vocab_file=None, merges_file=None,
                  seed=1234)
