"""A run directory damaged by a crash: a kill mid-line, or a node's crash that leaves zero-filled
blocks (NUL bytes) at the end of metrics.jsonl. Resume (a MetricsWriter opened on the run) moves
the damaged tail to RunDir.metrics_damaged with one warning and appends after the last whole
record, so every line of the file parses. A bad line in the middle is left where it is (the
report names it). A failure names the kind of damage."""
import json
import logging

import pytest

from megatron.base.records import read_metrics
from megatron.base.rundir import RunDir
from megatron.training.metrics import MetricsWriter
from tests.support.metrics import step_record

# kind of damage -> (the bytes a crash leaves after two whole lines, how many lines they make)
DAMAGE = {
    "cut mid-line": (b'{"step": 3, "loss": 2.5, "l', 1),
    "zero-filled tail": (b"\0" * 4096, 1),
    "a NUL-only line": (b"\0" * 100 + b"\n", 1),
    "cut mid-line, then zeros": (b'{"step": 3, "lo' + b"\0" * 8192, 1),
    "NUL lines and a zero-filled tail": (b"\0" * 50 + b"\n\n" + b"\0" * 70000, 3),
    "a line that is not a record": (b'{"surprise": 1}\n' + b"\0" * 10, 2),
}


def _damaged_run(path, tail: bytes) -> RunDir:
    run = RunDir(str(path))
    writer = MetricsWriter(run, tensorboard=False)
    for n in (1, 2):
        writer.write(step_record(n))
    writer.close()
    with open(run.metrics, "ab") as f:
        f.write(tail)
    return run


def _resume(run: RunDir, caplog) -> list:
    """Opens a writer on the run as resume does, writes step 3; the warnings it logged."""
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        writer = MetricsWriter(run, tensorboard=False)
    writer.write(step_record(3))
    writer.close()
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_resume_sets_a_damaged_tail_aside_and_appends_whole_lines(tmp_path, caplog, kind):
    tail, lines = DAMAGE[kind]
    run = _damaged_run(tmp_path, tail)
    warnings = _resume(run, caplog)
    data = open(run.metrics, "rb").read()
    assert data.endswith(b"\n") and b"\0" not in data, kind
    for i, line in enumerate(data.split(b"\n")[:-1], 1):
        json.loads(line)  # a failure here: line i of the resumed file is not JSON
    assert [r.step for r in read_metrics(run.metrics)] == [1, 2, 3], kind
    assert open(run.metrics_damaged, "rb").read() == tail, f"{kind}: set aside other bytes"
    assert len(warnings) == 1, warnings
    said = warnings[0]
    assert run.metrics in said and run.metrics_damaged in said, said
    assert f"{len(tail)} bytes" in said and f"{lines} line" in said, said


def test_a_second_repair_appends_to_the_set_aside_file(tmp_path, caplog):
    first, second = b'{"step": 3, "lo', b"\0" * 512
    run = _damaged_run(tmp_path, first)
    _resume(run, caplog)
    with open(run.metrics, "ab") as f:
        f.write(second)
    _resume(run, caplog)
    assert open(run.metrics_damaged, "rb").read() == first + second
    assert [r.step for r in read_metrics(run.metrics)] == [1, 2, 3, 3]


def test_a_whole_file_is_left_alone_without_a_warning(tmp_path, caplog):
    run = _damaged_run(tmp_path, b"")
    before = open(run.metrics, "rb").read()
    assert _resume(run, caplog) == []
    assert open(run.metrics, "rb").read().startswith(before)
    assert not (tmp_path / "metrics.jsonl.damaged").exists()


def test_a_bad_line_in_the_middle_stays_and_only_the_tail_goes(tmp_path, caplog):
    """Lines after a bad one are good records: dropping the bad line silently would hide it."""
    run = _damaged_run(tmp_path, b"not json\n")
    with open(run.metrics, "ab") as f:
        f.write(json.dumps({"step": 9, "loss": 1.0}).encode() + b"\n" + b"\0" * 4096)
    _resume(run, caplog)
    assert b"\nnot json\n" in open(run.metrics, "rb").read()
    assert open(run.metrics_damaged, "rb").read() == b"\0" * 4096
    skipped = []
    assert [r.step for r in read_metrics(run.metrics, skipped=skipped)] == [1, 2, 9, 3]
    assert len(skipped) == 1 and skipped[0].startswith(f"{run.metrics}:3 "), skipped


def test_a_file_of_nothing_but_zeros_is_set_aside_whole(tmp_path, caplog):
    run = RunDir(str(tmp_path))
    with open(run.metrics, "wb") as f:
        f.write(b"\0" * 4096)
    _resume(run, caplog)
    assert open(run.metrics_damaged, "rb").read() == b"\0" * 4096
    assert [r.step for r in read_metrics(run.metrics)] == [3]
