"""A user's plugin as the README shows it, through the installed console scripts: mypkg/variants.py
beside the config, `megatron-train --plugin mypkg.variants` from that folder (no PYTHONPATH; a
console script does not put the current folder on sys.path), then the run read back by every
command that reads its config.yaml, none told about the plugin again: megatron-generate,
megatron-convert to-single, a resumed megatron-train, megatron-plan memory --config. From another
folder the run's plugin is not importable and each says so, naming run.plugins."""
import os
import shutil
import subprocess

import pytest

from tests.support.cli import BIN, assert_clean_error, clean_env, sets, train_cmd
from tests.support.paths import TINY

pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(BIN, "megatron-generate")),
                                reason="the console scripts are not installed (pip install -e .)")

PLUGIN = '''import torch
from torch import nn
from megatron.config import variants


class ScaleNorm(nn.Module):
    """x / |x| times one learned gain (Nguyen and Salazar, 2019)."""
    def __init__(self, m, ctx):
        super().__init__()
        self.eps = m.norm_epsilon
        self.gain = nn.Parameter(torch.full((1,), float(m.hidden_size) ** 0.5))

    def forward(self, x):
        return self.gain * x / x.norm(dim=-1, keepdim=True).clamp(min=self.eps)


variants.register(variants.Variant("norm", "scalenorm_recorded", ScaleNorm,
                                   weights=(variants.Weight("gain", lambda m: (1,)),)))
'''


def _run(cmd, cwd, timeout=120):
    env = clean_env()
    env.pop("PYTHONPATH", None)  # as a user's shell: only what pip installed
    env.pop("MEGATRON_PLUGINS", None)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _ok(proc):
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def test_a_run_trained_with_a_plugin_is_read_back_by_every_command(tmp_path):
    work = tmp_path / "work"
    (work / "mypkg").mkdir(parents=True)
    (work / "mypkg" / "__init__.py").write_text("")
    (work / "mypkg" / "variants.py").write_text(PLUGIN)
    shutil.copy(TINY, work / "tiny.yaml")
    train = train_cmd("--config", "tiny.yaml", "--plugin", "mypkg.variants",
                      *sets("model.normalization=scalenorm_recorded", "training.train_iters=2",
                            "checkpoint.save=true", "run.dir=runs/p"))
    assert train[0].endswith("megatron-train"), "the console script, not python -m"
    _ok(_run(train, work))
    assert "plugins:\n  - mypkg.variants\n" in (work / "runs/p/config.yaml").read_text()

    generate = [os.path.join(BIN, "megatron-generate"), "--run-dir", "runs/p", "--prompt",
                "1 2", "--tokens", "3"]
    assert "sample 1" in _ok(_run(generate, work)).stdout
    convert = [os.path.join(BIN, "megatron-convert"), "to-single", "--run-dir", "runs/p",
               "--output", "p.pt"]
    _ok(_run(convert, work))
    assert (work / "p.pt").stat().st_size > 0
    plan = [os.path.join(BIN, "megatron-plan"), "memory", "--config", "runs/p/config.yaml",
            "--cluster", "frontier"]
    _ok(_run(plan, work))
    resumed = _ok(_run(train_cmd("--config", "runs/p/config.yaml",
                                 *sets("training.train_iters=3", "checkpoint.load=auto")), work))
    assert "resumed from" in resumed.stderr and "done: 3 steps" in resumed.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run_dir = str(work / "runs" / "p")
    for cmd in ([os.path.join(BIN, "megatron-generate"), "--run-dir", run_dir, "--prompt", "1"],
                [os.path.join(BIN, "megatron-convert"), "to-single", "--run-dir", run_dir,
                 "--output", "q.pt"]):
        proc = _run(cmd, elsewhere)
        assert_clean_error(proc, "run.plugins='mypkg.variants' is invalid",
                           "No module named 'mypkg'", "PYTHONPATH")
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (elsewhere / "q.pt").exists()
