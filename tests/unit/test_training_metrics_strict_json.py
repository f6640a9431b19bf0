"""metrics.jsonl stays strict JSON when a step diverges: NaN/Infinity become null and are named
in "nonfinite"; TensorBoard still receives the true values; and what the writer wrote reads back
as the same records (base/records.py)."""
import json
import math

import numpy as np

from megatron.base.records import (EvalRecord, SaveEvent, StartupRecord, read_metrics,
                                         strict_json_record)
from megatron.base.rundir import RunDir
from megatron.training.metrics import MetricsWriter
from tests.support.metrics import step_record


def _strict_loads(line: str):
    """A strict reader: Python's json accepts NaN/Infinity unless told otherwise."""
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(line, parse_constant=refuse)


class _FakeTB:
    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def close(self):
        pass


def _lines(tmp_path):
    with open(tmp_path / "metrics.jsonl") as f:
        return [_strict_loads(line) for line in f]




def test_nonfinite_values_are_null_and_named(tmp_path):
    w = MetricsWriter(RunDir(str(tmp_path)), tensorboard=False)
    w.write(step_record(1))
    w.write(step_record(2, loss=float("nan"), grad_norm=float("inf"), lr=-float("inf"),
                        skipped=True))
    w.write(EvalRecord(3, "valid", np.float32("nan")))
    w.close()
    first, second, valid = _lines(tmp_path)
    assert first["loss"] == 2.5 and first["grad_norm"] == 0.5 and first["mfu"] is None
    assert "nonfinite" not in first and "startup" not in first  # ordinary lines are unchanged
    assert second["loss"] is None and second["grad_norm"] is None and second["lr"] is None
    assert second["nonfinite"] == ["loss", "lr", "grad_norm"]
    assert second["mfu"] is None and second["skipped"] is True
    assert valid == {"step": 3, "split": "valid", "loss": None, "nonfinite": ["loss"]}


def test_what_the_writer_wrote_reads_back_as_the_same_records(tmp_path):
    w = MetricsWriter(RunDir(str(tmp_path)), tensorboard=False)
    written = [step_record(1, startup=StartupRecord(1.0, {"imports": 0.5}, 5.0, 0.25)),
               EvalRecord(1, "valid", 2.0),
               SaveEvent(1, 0.5, 0.01, 0.02)]
    for record in written:
        w.write(record)
    w.close()
    assert read_metrics(str(tmp_path / "metrics.jsonl")) == written
    assert _lines(tmp_path)[2]["event"] == "save"


def test_numpy_scalars_and_nested_values():
    line, nonfinite = strict_json_record({"step": np.int64(4), "loss": np.float32(1.5),
                                          "extra": {"a": float("nan")}})
    assert json.dumps(line) and type(line["step"]) is int
    assert line == {"step": 4, "loss": 1.5, "extra": {"a": None}, "nonfinite": ["extra.a"]}
    assert nonfinite == ["extra.a"]


def test_tensorboard_gets_the_true_values(tmp_path):
    w = MetricsWriter(RunDir(str(tmp_path)), tensorboard=False)
    tb = w.tb = _FakeTB()
    w.write(step_record(7, loss=float("nan"), grad_norm=1.0, skipped=True))
    w.close()
    tags = {tag: value for tag, value, step in tb.scalars}
    assert "train/step" not in tags and "train/skipped" not in tags  # no booleans, no step
    assert "train/mfu" not in tags and "train/loss_scale" not in tags  # no None
    assert math.isnan(tags["train/loss"]) and tags["train/grad_norm"] == 1.0
    assert all(s == 7 for _, _, s in tb.scalars)
