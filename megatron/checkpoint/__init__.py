"""Checkpoints: the commit protocol (store), the layout-free format any layout reads (sharded,
state), which checkpoint a run continues from (layout), the run-directory lock (rundir), and
conversions to one file and to/from Hugging Face (convert, init_from, hf_export, hf_import)."""
