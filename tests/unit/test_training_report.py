"""megatron-report's page and marks, in process: every event kind the records define
(records.EVENTS, enumerated here, so a kind added there is checked without touching this file)
is listed in the events table with its step, rank and node where the record has them, and is
marked in the plots; a run damaged by a crash and not repaired (a bad middle line, a NUL line,
a partial last line) is reported from what is readable, each skipped line named in the page and
in a warning of megatron-report, which exits 0 (as a process: tests/integration/
test_cli_report.py). A failure names the event kind or the line."""
import dataclasses
import html
import json
import re
import typing

import pytest

from megatron.base import records
from megatron.base.rundir import RunDir
from megatron.cli.report import main
from megatron.training import report
from megatron.training.metrics import MetricsWriter
from tests.support.metrics import step_record


def _sample(name: str, hint, n: int):
    """A value of a record's field by its type: ranks and nodes told apart by kind (n)."""
    if typing.get_origin(hint) is typing.Union:  # Optional[X]
        hint = [a for a in typing.get_args(hint) if a is not type(None)][0]
    if typing.get_origin(hint) is list:
        return [_sample(name, typing.get_args(hint)[0], n)]
    if hint is bool:  # before int: a bool is one to Python, not to the records' reader
        return n % 2 == 0
    if hint is int:
        return 100 + n
    if hint is float:
        return 1.5
    return f"nid{n:05d}" if name in ("host", "nodes") else f"{name} of kind {n}"


def one_of_each_kind():
    out = []
    for n, cls in enumerate(records.EVENTS.values()):
        hints = typing.get_type_hints(cls)
        values = {f.name: _sample(f.name, hints[f.name], n) for f in dataclasses.fields(cls)
                  if f.name != "event"}
        values["step"] = 10 * (n + 1)
        out.append(cls(**values))
    return out


def _event_rows(page: str) -> list:
    table = page.split("<h2>Events</h2>", 1)[1].split("</table>", 1)[0]
    return [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)]


@pytest.fixture()
def every_event_run(tmp_path):
    run = RunDir(str(tmp_path / "events"))
    writer = MetricsWriter(run, tensorboard=False)
    for n in range(1, 4):
        writer.write(step_record(n))
    events = one_of_each_kind()
    for event in events:
        writer.write(event)
    writer.close()
    return run, events


def test_every_event_kind_of_the_records_is_in_the_events_table(every_event_run, tmp_path):
    run, events = every_event_run
    assert main([run.path, "-o", str(tmp_path / "out")]) == 0
    rows = _event_rows((tmp_path / "out" / "index.html").read_text())
    for event in events:
        mine = [r for r in rows if r[1:3] == [str(event.step), event.event]]
        assert len(mine) == 1, f"{event.event} at step {event.step} not listed once: {rows}"
        text = " ".join(mine[0])
        for name in ("rank", "ranks", "host", "nodes", "reason"):
            value = getattr(event, name, None)
            for part in (value if isinstance(value, list) else [value] if value else []):
                assert str(part) in text, f"{event.event}: its {name} {part!r} not shown: {text}"


def test_every_event_kind_is_marked_in_the_plots(every_event_run):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    run, events = every_event_run
    fig, ax = plt.subplots()
    report._mark_events(ax, [report.load_run(run.path)])
    _, labels = ax.get_legend_handles_labels()
    plt.close(fig)
    assert sorted(labels) == sorted(records.EVENTS), "event kinds without a mark"
    assert set(report.EVENT_KINDS) == set(records.EVENTS)


def _damaged_run(path) -> RunDir:
    """Lines 1, 3, 5 and 6 are records; 2 is not JSON, 4 is NUL bytes, 7 was cut short."""
    run = RunDir(str(path))
    path.mkdir()
    good = [json.dumps(records.record_json(step_record(n))) for n in (1, 2, 3, 4)]
    with open(run.metrics, "wb") as f:
        f.write("\n".join([good[0], '{"step": 2, "loss": 2.', good[1], "\0" * 64, good[2],
                           good[3], '{"step": 5, "lo']).encode())
    return run


def test_a_damaged_run_is_reported_from_what_is_readable(tmp_path, capsys):
    run = _damaged_run(tmp_path / "damaged")
    assert main([run.path, "-o", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if "warning" in line]
    for n in (2, 4, 7):
        assert any(f"{run.metrics}:{n} " in line for line in warned), f"line {n}: {err}"
    assert len(warned) == 3, err
    page = html.unescape((tmp_path / "out" / "index.html").read_text())
    for n in (2, 4, 7):
        assert f"{run.metrics}:{n} " in page, f"the page does not name skipped line {n}"
    data = json.loads(re.search(r'id="series">(.*?)</script>', page, re.S).group(1))
    assert data["panels"]["loss"]["damaged: train/loss"][0] == [1.0, 2.0, 3.0, 4.0]


def test_an_output_that_is_a_file_and_a_run_given_twice_are_refused(every_event_run, tmp_path,
                                                                     capsys):
    """-o FILE (or a folder under it) raised a bare 'File exists'; one run given twice (as two paths) was plotted as
    two series of the same values. Both now refuse before anything is written."""
    run, _ = every_event_run
    taken = tmp_path / "notes.txt"
    taken.write_text("mine\n")
    assert main([run.path, "-o", str(taken)]) == 2
    assert f"--output: '{taken}' is a file, not a directory" in capsys.readouterr().err
    assert main([run.path, "-o", str(taken / "page")]) == 2
    assert f"lies inside the file '{taken}'" in capsys.readouterr().err
    assert taken.read_text() == "mine\n"
    out = tmp_path / "page"
    assert main([run.path, run.path + "/", "-o", str(out)]) == 2
    assert f"run directory '{run.path}/' is given twice (as '{run.path}' too)" in \
        capsys.readouterr().err
    assert not out.exists()


def test_steps_trained_again_are_shown_the_second_time_and_listed(tmp_path):
    """A job that logged steps 1-5 and stopped with its last save at step 2, then a resume from
    it (steps 3-6), then a rollback to step 5 (6 again): file order drew the loss back over
    itself (5 -> 3); the panels keep each step's last training and the page lists 3-5 and 6."""
    run = RunDir(str(tmp_path / "resumed"))
    writer = MetricsWriter(run, tensorboard=False)
    for n in range(1, 6):
        writer.write(step_record(n, loss=10.0 - n))
    writer.write(records.EvalRecord(4, "valid", 7.5))  # the first history's evaluation
    for n in range(3, 7):
        writer.write(step_record(n, loss=20.0 - n))
    writer.write(step_record(6, loss=1.0))
    writer.close()
    assert main([run.path, "-o", str(tmp_path / "out")]) == 0
    page = html.unescape((tmp_path / "out" / "index.html").read_text())
    data = json.loads(re.search(r'id="series">(.*?)</script>', page, re.S).group(1))
    assert data["panels"]["loss"]["resumed: train/loss"] == [
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [9.0, 8.0, 17.0, 16.0, 15.0, 1.0]]
    assert "resumed: valid/loss" not in data["panels"]["loss"]  # step 4's was trained again
    section = page.split("<h2>Steps trained again</h2>", 1)[1]
    assert "resumed: steps 3-5" in section and "resumed: steps 6-6" in section
    assert report.load_run(run.path).last_step == 6
