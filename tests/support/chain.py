"""Run directories as chained jobs find them: committed (or damaged) checkpoints, and the field
separator of the stand-in squeue lines."""
import json

from megatron.base.store import META

from tests.support.checkpoints import meta_json

SEP = "\x1f"


def commit(run_dir, step, complete=True):
    folder = run_dir / "checkpoints" / f"step_{step:07d}"
    folder.mkdir(parents=True)
    files = {"shards/a.pt": 3}
    (folder / "shards").mkdir()
    (folder / "shards" / "a.pt").write_bytes(b"abc" if complete else b"ab")
    (folder / META).write_text(json.dumps(meta_json(step, files)))
