"""Shared pieces of the end-to-end tests: a clean launch environment in which every compiler is a
stub that records its call and fails, and what a finished run left behind."""
import os
import sys

from tests.support.procs import free_port
from tests.support.paths import ROOT, TINY
from megatron.base.records import read_metrics, steps
from megatron.base.rundir import RunDir

__all__ = ["ROOT", "TINY", "RunEnv", "free_port", "set_args", "train_steps"]

COMPILERS = ("ninja", "cc", "c++", "gcc", "g++", "clang", "clang++", "nvcc", "hipcc", "ld",
             "x86_64-linux-gnu-gcc", "x86_64-linux-gnu-g++")
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "GROUP_RANK", "ROLE_RANK")


class RunEnv:
    """env: the caller's environment minus launcher variables (the suite may itself run inside a
    Slurm job or torchrun), with compiler stubs first on PATH and an empty TORCH_EXTENSIONS_DIR."""

    def __init__(self, tmp_path):
        self.stubs, self.ext = tmp_path / "compiler_stubs", tmp_path / "torch_extensions"
        self.log = tmp_path / "compiler_calls.log"
        self.stubs.mkdir()
        self.ext.mkdir()
        for name in COMPILERS:
            stub = self.stubs / name
            stub.write_text(f'#!/bin/sh\necho "{name} $*" >> "{self.log}"\nexit 1\n')
            stub.chmod(0o755)
        env = {k: v for k, v in os.environ.items()
               if k not in LAUNCH_VARS and not k.startswith(("SLURM_", "TORCHELASTIC_"))}
        env.update(PATH=f"{self.stubs}{os.pathsep}{os.path.dirname(sys.executable)}{os.pathsep}"
                   f"{env.get('PATH', '')}", TORCH_EXTENSIONS_DIR=str(self.ext),
                   OMP_NUM_THREADS="1")
        self.env = env

    def assert_compiled_nothing(self, output: str) -> None:
        assert not self.log.exists(), f"a compiler ran:\n{self.log.read_text()}"
        built = sorted(p.name for p in self.ext.iterdir())
        assert built == [], f"TORCH_EXTENSIONS_DIR is no longer empty: {built}"
        for marker in ("Building extension", "Loading extension", "ninja"):
            assert marker not in output, f"{marker!r} in the run's output"


def train_steps(run_dir: str):
    """Training steps logged in run_dir/metrics.jsonl (evaluation lines excluded)."""
    return [r.step for r in steps(read_metrics(RunDir(str(run_dir)).metrics))]


def set_args(*items):
    return [a for item in items for a in ("--set", item)]
