"""examples/local/demo.sh and the repository's other shell scripts: the demo deletes RUN_DIR to
start afresh, so it refuses a folder it did not make (RUN_DIR=. or a real run's folder was
removed by rm -rf) before preparing any data; `make clean` removes build outputs and the demo's
marked folder, never a training run under runs/ (it deleted runs/ whole); and every script
passes shellcheck."""
import os
import shutil
import subprocess

import pytest

from tests.support.paths import ROOT

DEMO = os.path.join(ROOT, "examples", "local", "demo.sh")
MAKEFILE = os.path.join(ROOT, "Makefile")


@pytest.mark.parametrize("kind", ["a run's folder", "a file"])
def test_the_demo_refuses_a_run_dir_it_did_not_make(tmp_path, kind):
    target = tmp_path / "target"
    if kind == "a file":
        target.write_text("mine\n")
    else:
        target.mkdir()
        (target / "metrics.jsonl").write_text("{}\n")
    env = dict(os.environ, RUN_DIR=str(target), PY="/nonexistent-python")  # nothing may run
    proc = subprocess.run(["bash", DEMO], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert f"demo.sh: error: RUN_DIR={target} exists and was not made by the demo" in proc.stderr
    assert proc.stdout == ""
    kept = target.read_text() if kind == "a file" else (target / "metrics.jsonl").read_text()
    assert kept in ("mine\n", "{}\n")


def test_make_clean_keeps_training_runs(tmp_path):
    for folder in ("build/lib", "megatron_frontier.egg-info", "runs/tiny/checkpoints",
                   "runs/demo", "runs/demo-copy"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "runs/tiny/checkpoints/latest").write_text("step_0000004\n")
    (tmp_path / "runs/demo/.megatron-demo").write_text("")
    proc = subprocess.run(["make", "-f", MAKEFILE, "-C", str(tmp_path), "clean"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["runs"]
    assert sorted(os.listdir(tmp_path / "runs")) == ["demo-copy", "tiny"]
    assert (tmp_path / "runs/tiny/checkpoints/latest").read_text() == "step_0000004\n"


def test_the_shell_scripts_pass_shellcheck():
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed (make toolchains installs it as root)")
    scripts = [DEMO] + sorted(os.path.join(ROOT, "tools", n)
                              for n in os.listdir(os.path.join(ROOT, "tools")) if n.endswith(".sh"))
    proc = subprocess.run(["shellcheck", *scripts], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
