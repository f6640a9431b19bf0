"""The package as `pip install .` leaves it (not the editable install the suite runs from):
built from a copy of the repository's files into a folder of its own (`pip install --target`,
no dependencies: this venv's torch and DeepSpeed serve), then used from a folder outside the
repository, so only what the wheel holds can be found. It must hold the C++ data helper (built
at install, never at run time) and the planner's published runs, and the console scripts must
train, plan and convert from there."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.support.cli import clean_env
from tests.support.paths import ROOT, TINY

pytestmark = pytest.mark.slow


def _ok(proc):
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def test_a_non_editable_install_trains_plans_and_finds_its_data_files(tmp_path):
    target, outside, source = tmp_path / "site", tmp_path / "user", tmp_path / "source"
    outside.mkdir()
    # the files a clone has (tracked, and new ones not ignored), not the build/ folder an
    # earlier build left, which setuptools would copy from as it is
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, timeout=60, check=True).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if os.path.isfile(os.path.join(ROOT, name)):
            os.makedirs(source / os.path.dirname(name), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, name), source / name)
    _ok(subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--no-build-isolation", "--no-compile", "--target", str(target),
                        str(source)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path,
                       env=clean_env()))
    env = clean_env(PYTHONPATH=str(target))
    env.pop("MEGATRON_PLUGINS", None)
    bin_dir = target / "bin"

    def run(*cmd, timeout=300):
        return _ok(subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                                  timeout=timeout, cwd=outside, env=env))

    probe = ("import json, megatron, megatron.data._helpers as h, megatron.planner.validation as v;"
             "print(json.dumps([megatron.__file__, h.__file__, v.DATA, len(v.load_cases())]))")
    package, helper, data, cases = json.loads(run(sys.executable, "-c", probe).stdout)
    for path in (package, helper, data):
        assert path.startswith(str(target)), f"{path} is not the installed copy's"
    assert cases > 50, "the published runs did not come with the package"
    (outside / "tiny.yaml").write_text(open(TINY).read())
    trained = run(sys.executable, bin_dir / "megatron-train", "--config", "tiny.yaml",
                  "--set", "training.train_iters=2", "--set", "run.dir=runs/a",
                  "--set", "checkpoint.save=true")
    assert "done: 2 steps" in trained.stderr
    plan = run(sys.executable, bin_dir / "megatron-plan", "memory", "--config",
               "runs/a/config.yaml", "--cluster", "frontier")
    assert "predicted step" in plan.stdout
    run(sys.executable, bin_dir / "megatron-convert", "to-single", "--run-dir", "runs/a",
        "--output", "a.pt")
    assert (outside / "a.pt").stat().st_size > 0
