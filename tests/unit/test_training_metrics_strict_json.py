"""metrics.jsonl stays strict JSON when a step diverges: NaN/Infinity become null and are named
in "nonfinite"; TensorBoard still receives the true values."""
import json
import math

import numpy as np

from megatron.training.metrics import MetricsWriter


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
    w = MetricsWriter(str(tmp_path), tensorboard=False)
    w.write({"step": 1, "loss": 2.5, "grad_norm": 0.5, "mfu": None, "skipped": False})
    w.write({"step": 2, "loss": float("nan"), "grad_norm": float("inf"),
             "lr": -float("inf"), "mfu": None, "skipped": True})
    w.write({"step": 3, "split": "valid", "loss": np.float32("nan")})
    w.close()
    first, second, valid = _lines(tmp_path)
    assert first == {"step": 1, "loss": 2.5, "grad_norm": 0.5, "mfu": None, "skipped": False}
    assert "nonfinite" not in first  # ordinary lines are unchanged
    assert second["loss"] is None and second["grad_norm"] is None and second["lr"] is None
    assert second["nonfinite"] == ["loss", "grad_norm", "lr"]
    assert second["mfu"] is None and second["skipped"] is True
    assert valid == {"step": 3, "split": "valid", "loss": None, "nonfinite": ["loss"]}


def test_numpy_scalars_and_nested_values(tmp_path):
    w = MetricsWriter(str(tmp_path), tensorboard=False)
    w.write({"step": np.int64(4), "loss": np.float32(1.5), "extra": {"a": float("nan")}})
    w.close()
    (line,) = _lines(tmp_path)
    assert line == {"step": 4, "loss": 1.5, "extra": {"a": None}, "nonfinite": ["extra.a"]}


def test_tensorboard_gets_the_true_values(tmp_path):
    w = MetricsWriter(str(tmp_path), tensorboard=False)
    w.tb = _FakeTB()
    w.write({"step": 7, "loss": float("nan"), "grad_norm": 1.0, "mfu": None, "skipped": True})
    w.close()
    tags = {tag: value for tag, value, step in w.tb.scalars}
    assert set(tags) == {"train/loss", "train/grad_norm"}  # no None, no booleans, no step
    assert math.isnan(tags["train/loss"]) and tags["train/grad_norm"] == 1.0
    assert all(step == 7 for _, _, step in w.tb.scalars)
