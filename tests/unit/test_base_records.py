"""The records of a run (base/records.py) and the run directory's owner
(base/rundir.py) are the only homes of their names, the way test_architecture.py holds the
import rules: a failure names the file and line that names a run-directory file or reads a
record key by string instead of asking RunDir or the records. Also: meta.json refuses a missing
or unknown key with one message naming the file, and the README's table of metrics.jsonl lines
is the records' definition."""
import ast
import dataclasses
import json
import re
from pathlib import Path

import pytest

from megatron.base import records, rundir, store
from megatron.checkpoint.layout import find_resume
from megatron.config import load_config
from megatron.config.errors import InputError
from tests.support.checkpoints import meta_json
from tests.support.paths import ROOT

REPO = Path(ROOT)
# Code that reads or writes run directories: the package and the benchmarks (tests may poke at
# files directly: that is what they check).
SCANNED = [p for d in ("megatron", "benchmarks", "tools") for p in sorted((REPO / d).rglob("*.py"))]

RUN_FILES = {rundir.CONFIG, rundir.DEEPSPEED, rundir.METRICS, rundir.METRICS_DAMAGED,
             rundir.TENSORBOARD, rundir.CHECKPOINTS, rundir.LOCK, rundir.CHAIN_LOG}
CHECKPOINT_FILES = {store.META, store.INDEX, store.LATEST}
HOMES = {REPO / "megatron/base/rundir.py": RUN_FILES,
         REPO / "megatron/base/store.py": CHECKPOINT_FILES}

# Keys of the records that no other record or config of this project shares; reading one by
# string (x["key"], x.get("key"), "key" in x) outside records.py is reading a record around it.
# (first_step_at is not among them: the trainer benchmark's workers report it under that name.)
RECORD_KEYS = {"consumed_samples", "saved_at", "adam_step", "step_time_s", "tokens_per_sec",
               "grad_norm", "loss_scale", "gb_per_s", "to_step", "nonfinite", "event",
               "first_step_s", "split"}
# Benchmarks that read the JSON results they wrote themselves (not a run's records), by module.
OWN_RESULTS = {"benchmarks/trainer/report.py", "benchmarks/kernels/bench_kernels.py",
               "benchmarks/e2e/e2e_report.py"}


def _path_arguments(tree):
    """String constants passed to a call or joined with `/`: how a file name becomes a path."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    yield arg.value, arg.lineno
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            for side in (node.left, node.right):
                if isinstance(side, ast.Constant) and isinstance(side.value, str):
                    yield side.value, side.lineno


def _key_reads(tree):
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "pop") and node.args
              and isinstance(node.args[0], ast.Constant)):
            key = node.args[0].value
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant):
            key = node.left.value
        if isinstance(key, str):
            yield key, node.lineno


def test_only_the_run_directory_owner_names_its_files():
    wrong = []
    for path in SCANNED:
        allowed = HOMES.get(path, set())
        for value, line in _path_arguments(ast.parse(path.read_text(), str(path))):
            if value in (RUN_FILES | CHECKPOINT_FILES) - allowed:
                wrong.append(f"{path.relative_to(REPO)}:{line} names {value!r}: ask "
                             "megatron.base.rundir.RunDir (or store.py inside a checkpoint)")
    assert not wrong, "\n".join(wrong)


def test_only_the_records_read_record_keys():
    wrong = []
    for path in SCANNED:
        rel = str(path.relative_to(REPO))
        if path.name == "records.py" or rel in OWN_RESULTS:
            continue
        for key, line in _key_reads(ast.parse(path.read_text(), rel)):
            if key in RECORD_KEYS:
                wrong.append(f"{rel}:{line} reads {key!r} by string: parse the line or meta.json "
                             "with megatron.base.records and read the field")
    assert not wrong, "\n".join(wrong)


def test_the_scans_see_what_they_look_for():
    """The two rules would pass vacuously if the scanners found nothing."""
    tree = ast.parse('os.path.join(d, "metrics.jsonl")\nrow["step_time_s"]\nr.get("event")\n'
                     'Path(d) / "checkpoints"')
    assert {"metrics.jsonl", "checkpoints"} <= {v for v, _ in _path_arguments(tree)}
    assert {k for k, _ in _key_reads(tree)} == {"step_time_s", "event"}


# --- meta.json ------------------------------------------------------------------------------

def _checkpoint(tmp_path, edit):
    folder = tmp_path / "checkpoints" / "step_0000004"
    (folder / "shards").mkdir(parents=True)
    (folder / "shards" / "a.pt").write_bytes(b"abc")
    meta = meta_json(4, {"shards/a.pt": 3})
    edit(meta)
    (folder / store.META).write_text(json.dumps(meta))
    return folder


@pytest.mark.parametrize("edit, words", [
    (lambda m: m.pop("consumed_samples"), "lacks the key(s) consumed_samples"),
    (lambda m: m.pop("adam_step"), "lacks the key(s) adam_step"),
    (lambda m: m.update(surprise=1), "unknown key(s) surprise"),
    (lambda m: m["layout"].pop("zero_stage"), "its layout lacks the key(s) zero_stage"),
    (lambda m: m.update(format="megatron-frontier/sharded-v9"), "sharded-v9"),
    (lambda m: m.update(step="six"), "step is 'six', expected a JSON int"),
    (lambda m: m.update(consumed_samples=None), "consumed_samples is None"),
    (lambda m: m["layout"].update(tensor_parallel_size=2.5), "tensor_parallel_size is 2.5"),
    (lambda m: m["files"].update({"shards/a.pt": "3"}), "not a whole number"),
    (lambda m: m.pop("data"), "lacks the key(s) data"),
    (lambda m: m["data"].update(seed=True), "seed is True"),
])
def test_a_meta_record_that_does_not_fit_is_one_error_naming_the_file(tmp_path, edit, words):
    folder = _checkpoint(tmp_path, edit)
    with pytest.raises(store.Incomplete, match=re.escape(words)):
        store.validate(str(folder))
    cfg = load_config(None, [f"run.dir={tmp_path}", "training.load=auto"])
    with pytest.raises(InputError) as e:
        find_resume(cfg)
    assert str(folder) in str(e.value) and words in str(e.value)


def test_a_newer_checkpoint_whose_record_does_not_fit_is_skipped_for_the_older_one(tmp_path,
                                                                                   caplog):
    older = _checkpoint(tmp_path, lambda m: None)
    newer = tmp_path / "checkpoints" / "step_0000006"
    newer.mkdir()
    meta = json.loads((older / store.META).read_text())
    meta.update(step="six")
    (newer / store.META).write_text(json.dumps(meta))
    cfg = load_config(None, [f"run.dir={tmp_path}", "training.load=auto"])
    assert find_resume(cfg).folder == str(older)
    assert str(newer) in caplog.text and "step is 'six'" in caplog.text


def test_meta_json_round_trips_and_keeps_the_v1_layout_on_disk(tmp_path):
    fixture = REPO / "tests/support/data/checkpoint_v1_tp2/checkpoints/step_0000004"
    raw = json.loads((fixture / store.META).read_text())
    meta = store.validate(str(fixture))
    assert meta.step == 4 and meta.layout.tensor_parallel_size == 2
    assert meta.to_json() == raw  # what today's writer writes is what main wrote


# --- the README's table of metrics.jsonl lines ------------------------------------------------

def _readme_rows():
    text = (REPO / "README.md").read_text()
    section = text.split("metrics.jsonl lines", 1)[1]
    rows = {}
    for line in section.splitlines()[1:]:
        if line.startswith("| ") and not line.startswith("| line"):
            kind, keys = [c.strip() for c in line.strip().strip("|").split("|")][:2]
            rows[kind] = set(re.findall(r"`([a-z_]+)`", keys))
        elif rows and not line.startswith("|"):
            break
    return rows


def _record_for(kind: str):
    if kind == "a training step":
        return records.StepRecord
    if kind == "an evaluation":
        return records.EvalRecord
    event = re.fullmatch(r'`"event": "(\w+)"`', kind)
    assert event, f"README row {kind!r} names no record"
    return records.EVENTS[event.group(1)]


def test_the_readme_describes_metrics_lines_as_the_records_define_them():
    rows = _readme_rows()
    assert len(rows) == 2 + len(records.EVENTS), sorted(rows)
    for kind, keys in rows.items():
        cls = _record_for(kind)
        fields = {f.name for f in dataclasses.fields(cls)} - {"event"}
        assert keys == fields, f"README row {kind!r}: {sorted(keys ^ fields)} differ"


# --- reading a metrics.jsonl that a crash damaged ---------------------------------------------

def _damaged_metrics(tmp_path):
    """Lines 1, 3 and 5 are records; 2 is not JSON, 4 is NUL bytes, 6 was cut short."""
    good = [json.dumps(records.record_json(records.EvalRecord(n, "valid", 2.0))) for n in (1, 2, 3)]
    path = tmp_path / rundir.METRICS
    path.write_bytes("\n".join([good[0], "not json", good[1], "\0" * 64, good[2],
                                '{"step": 4, "lo']).encode())
    return str(path)


def test_read_metrics_is_strict_unless_asked_to_skip(tmp_path):
    path = _damaged_metrics(tmp_path)
    with pytest.raises(records.RecordError, match=re.escape(f"{path}:2 is not JSON")):
        records.read_metrics(path)
    skipped = []
    assert [r.step for r in records.read_metrics(path, skipped=skipped)] == [1, 2, 3]
    assert [s.split(" ", 1)[0] for s in skipped] == [f"{path}:2", f"{path}:4", f"{path}:6"]
    assert "NUL" in skipped[1] and "cut short" in skipped[2], skipped


def test_strict_reading_still_leaves_out_a_cut_or_zero_filled_last_line(tmp_path):
    path = tmp_path / rundir.METRICS
    line = json.dumps(records.record_json(records.EvalRecord(1, "valid", 2.0)))
    for tail in ('{"step": 2, "lo', "\0" * 4096):
        path.write_text(line + "\n" + tail)
        assert [r.step for r in records.read_metrics(str(path))] == [1], repr(tail[:8])


@pytest.mark.parametrize("line,words", [
    ('{"step": "two", "loss": 1.0}', "step is 'two', expected a JSON int"),
    ('{"step": 2, "loss": "nan"}', "loss is 'nan', expected null or a JSON float"),
    ('{"step": true, "split": "valid", "loss": 1.0}', "step is True, expected a JSON int"),
    ('{"step": 2, "split": 3, "loss": 1.0}', "split is 3, expected a JSON str"),
    ('{"event": "save", "step": 2, "seconds": "slow", "gb": 1, "gb_per_s": null}',
     "seconds is 'slow'"),
    ('{"event": "state_suspect", "step": 2, "rank": 0, "host": "n", "what": "w", '
     '"known": "yes"}', "known is 'yes', expected a JSON bool"),
])
def test_a_line_whose_value_has_the_wrong_type_is_not_a_record(tmp_path, line, words):
    """Keys were checked, values were not: megatron-report met step "two" in max() and died
    with a TypeError. A value of the wrong JSON type is now a RecordError naming the file, line
    and key (a null float, what the writer puts for a non-finite value, reads as None)."""
    path = tmp_path / rundir.METRICS
    good = json.dumps(records.record_json(records.EvalRecord(1, "valid", None)))
    path.write_text(f"{good}\n{line}\n")
    with pytest.raises(records.RecordError, match=re.escape(f"{path}:2: {words}")):
        records.read_metrics(str(path))
    skipped = []
    assert [r.step for r in records.read_metrics(str(path), skipped=skipped)] == [1]
    assert len(skipped) == 1 and words in skipped[0]
