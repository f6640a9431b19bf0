"""megatron-report on two runs, one of them still in progress (its last line half-written): the
page renders in headless Chromium to a screenshot that is not blank, and the series plotted (as
the page's embedded data, read back from Chromium's DOM) are exactly the values metrics.jsonl
holds, read through records.read_metrics; events appear in the page. A run damaged by a crash and
not repaired (a bad middle line, a partial last line) is reported with exit 0 and a warning per
skipped line. A failure names the panel and the series, or the line."""
import html
import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.support.cli import clean_env
from tests.support.metrics import step_record
from tests.support.paths import ROOT
from megatron.base.records import (EvalRecord, RollbackEvent, SaveEvent, SpikeEvent,
                                         StepRecord, StopEvent, read_metrics)
from megatron.base.rundir import RunDir
from megatron.training.metrics import MetricsWriter
from megatron.training.report import PANELS

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _write_run(path, steps, scale, in_progress=False):
    writer = MetricsWriter(RunDir(str(path)), tensorboard=False)
    for n in range(1, steps + 1):
        writer.write(step_record(n, loss=scale * 5.0 / n, lr=1e-3 * min(1, n / 5),
                                 grad_norm=1.0 / n, tokens_per_sec=1000.0 + n,
                                 tflops_per_gpu=0.5 + n / 100, mfu=0.1 + n / 1000,
                                 mem_gb=1.5 + n / 50, loss_scale=2.0 ** 16))
        if n % 10 == 0:
            writer.write(EvalRecord(n, "valid", scale * 6.0 / n))
            writer.write(SaveEvent(n, 1.5, 0.25, 0.17, 1.5, 0.0))
    writer.write(SpikeEvent(7, "loss 9.1 > 3 x median 2.0"))
    writer.write(RollbackEvent(8, 5, "spike at step 7"))
    if in_progress:
        writer.close()
        with open(RunDir(str(path)).metrics, "a") as f:
            f.write('{"step": 99, "loss": 1.2, "lr')  # the run is writing this line now
    else:
        writer.write(EvalRecord(steps, "test", scale * 6.5 / steps))
        writer.write(StopEvent(steps, "signal"))
        writer.close()


def _expected(path, name):
    """Label -> (x, y) of every line the report should draw, from read_metrics."""
    records = read_metrics(RunDir(str(path)).metrics)
    out = {}
    for key, _, _, field in PANELS:
        points = [(r.step, getattr(r, field)) for r in records if isinstance(r, StepRecord)]
        out[(key, f"{name}: train/{field}")] = points
    for split in ("valid", "test"):
        points = [(r.step, r.loss) for r in records
                  if isinstance(r, EvalRecord) and r.split == split]
        if points:
            out[("loss", f"{name}: {split}/loss")] = points
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    _write_run(d / "alpha", 30, 1.0)
    _write_run(d / "beta", 20, 1.3, in_progress=True)
    out = d / "out"
    proc = subprocess.run([sys.executable, "-m", "megatron.cli.report", str(d / "alpha"),
                           str(d / "beta"), "--output", str(out)], cwd=ROOT, env=clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return d, out


def test_report_files_and_events(report):
    d, out = report
    for key, _, _, _ in PANELS:
        assert (out / f"{key}.png").stat().st_size > 5000, f"{key}.png is missing or empty"
    page = (out / "index.html").read_text()
    assert "src='data:image/png;base64," in page and "<img" in page
    assert "http" not in re.sub(r"<!DOCTYPE[^>]*>", "", page), "the page must be self-contained"
    for fragment in ("spike", "rollback", "to step 5", "0.17 GB/s", "stop", "signal"):
        assert fragment in html.unescape(page), f"{fragment!r} not in the events table"


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium (make test installs Debian's "
                    "chromium through tools/install_toolchains.sh when run as root)")
def test_report_renders_in_chromium_with_the_logged_series(report):
    d, out = report
    url = "file://" + str(out / "index.html")
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--user-data-dir={d / 'chrome-profile'}", "--window-size=1400,2400"]
    shot = d / "shot.png"
    subprocess.run(base + [f"--screenshot={shot}", url], capture_output=True, timeout=120,
                   env=clean_env())
    assert shot.exists(), "Chromium wrote no screenshot"
    from PIL import Image
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    assert pixels.std() > 10, "the screenshot is blank"
    assert (pixels < 128).mean() > 0.005, "the screenshot shows almost nothing dark (no plots)"
    dom = subprocess.run(base + ["--dump-dom", url], capture_output=True, text=True,
                         timeout=120, env=clean_env()).stdout
    data = json.loads(html.unescape(re.search(r'<script type="application/json" id="series">'
                                              r'(.*?)</script>', dom, re.S).group(1)))
    expected = {**_expected(d / "alpha", "alpha"), **_expected(d / "beta", "beta")}
    got = {(panel, label): list(zip(*xy)) for panel, lines in data["panels"].items()
           for label, xy in lines.items()}
    assert set(got) == set(expected), "the panels draw other series than metrics.jsonl holds"
    for key, points in expected.items():
        assert [(int(x), y) for x, y in got[key]] == [(s, float(v)) for s, v in points], key
    assert max(x for x, _ in got[("loss", "beta: train/loss")]) == 20, "partial line plotted"


def test_a_damaged_run_is_reported_with_a_warning_per_skipped_line(tmp_path):
    _write_run(tmp_path / "gamma", 12, 1.0)
    metrics = RunDir(str(tmp_path / "gamma")).metrics
    lines = open(metrics, "rb").read().split(b"\n")
    lines.insert(3, b"\0" * 32 + b'{"step": 3, "lo')  # a line a crash cut, then appended to
    with open(metrics, "wb") as f:
        f.write(b"\n".join(lines[:-1]) + b'\n{"step": 13, "loss": 1.')
    proc = subprocess.run([sys.executable, "-m", "megatron.cli.report", str(tmp_path / "gamma"),
                           "--output", str(tmp_path / "out")], cwd=ROOT, env=clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warned) == 2, proc.stderr
    assert f"{metrics}:4 " in warned[0] and "NUL" in warned[0], warned
    assert f"{metrics}:{len(lines)} " in warned[1] and "cut short" in warned[1], warned
    assert "skipped" in (tmp_path / "out" / "index.html").read_text()
