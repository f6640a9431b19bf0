"""The ground floor beside config: torch-free records and file rules that every layer above may
read, the planner included. The run directory (rundir.RunDir: its file names, lock and which
checkpoint continues a run), the commit protocol's files (store), the records of meta.json and
metrics.jsonl (records), the generated deepspeed.json (deepspeed_json), which optimizer
DeepSpeed ends up using (optimizer_kind) and the check of every output path (outputs). Imports
config only."""
