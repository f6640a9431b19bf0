"""Checkpoints and the run directory: the directory's owner (rundir: its files, its lock, which
checkpoint continues a run), the records written into it (records: meta.json, metrics.jsonl), the
commit protocol (store), the layout-free format any layout reads (sharded, state), the layout
record and resume choice (layout), and conversions to one file and to/from Hugging Face
(convert, init_from, hf_export, hf_import). rundir, records and store are standard library only."""
