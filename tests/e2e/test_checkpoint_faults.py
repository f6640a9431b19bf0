"""A checkpoint is complete or invisible, through the real CLI and real kills.

- kill -9 of rank 1 of a DP2 ZeRO-1 run while it saves (seeded: three kills aimed at the moment a
  save's staging folder appears, plus a random delay; one at a random time), then a resume: it
  always starts from a complete checkpoint, whose every file loads.
- a damaged shard inside a committed checkpoint: one message naming the file and the last good
  checkpoint, no traceback, config.yaml untouched.
- a second run on the same run.dir is refused with the holder's host and pid.
- a run.dir that is a file is one message."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from megatron.base import store
from tests.e2e.e2e_helpers import ROOT, TINY, RunEnv, set_args
from tests.support.procs import torchrun_cmd

pytestmark = pytest.mark.slow
EXE = os.path.join(os.path.dirname(sys.executable), "megatron-train")
# Large enough that writing a checkpoint takes a good part of each step (about 40 MB a save).
BIG = ("model.hidden_size=256", "model.num_attention_heads=4", "model.vocab_size=500",
       "training.tensorboard=false", "training.log_interval=1")
SEED = 20261130


def _cmd(nproc, run_dir, *items):
    cmd = [EXE] if nproc == 1 else [*torchrun_cmd(nproc), EXE]
    return cmd + ["--config", TINY, *set_args(*BIG, f"run.dir={run_dir}", *items)]


@pytest.fixture
def env(tmp_path):
    home = tmp_path / "env"
    home.mkdir()
    return RunEnv(home).env


def _rank_pid(parent: int, rank: str):
    """The pid of the torchrun worker with RANK=rank."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid == parent and f"RANK={rank}".encode() in environ:
            return int(name)
    return None


def _kill_during_save(run_dir, env, aimed: bool, delay: float) -> bool:
    """Starts the run, kills rank 1 once a checkpoint exists (aimed: when the next save starts,
    after `delay`). Returns whether a save was in progress at the kill."""
    ckpt = run_dir / "checkpoints"
    proc = subprocess.Popen(_cmd(2, run_dir, "parallel.zero_stage=1", "training.save_interval=1",
                                 "training.train_iters=100000"),
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while not store.committed(str(ckpt)) and time.time() < deadline:
            time.sleep(0.05)
        assert store.committed(str(ckpt)), "the run committed no checkpoint in 240 s"
        victim = _rank_pid(proc.pid, "1")  # found first: a save of this model takes milliseconds
        assert victim, "rank 1 not found"
        if aimed:
            before = set(os.listdir(ckpt))
            while not any(n.startswith(".staging-") for n in set(os.listdir(ckpt)) - before):
                time.sleep(0.001)
        time.sleep(delay)
        in_save = any(n.startswith(".staging-") for n in os.listdir(ckpt))
        os.kill(victim, signal.SIGKILL)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return in_save


def test_kills_during_saves_always_resume_from_a_complete_checkpoint(tmp_path, env):
    rng = random.Random(SEED)
    trials = [(True, rng.uniform(0.0, 0.005)) for _ in range(3)] + [(False, rng.uniform(0, 1.0))]
    hit = 0
    for i, (aimed, delay) in enumerate(trials):
        run_dir = tmp_path / f"run{i}"
        hit += _kill_during_save(run_dir, env, aimed, delay)
        ckpt = str(run_dir / "checkpoints")
        found, skipped = store.newest_complete(ckpt)
        assert found is not None and not skipped, (found, skipped)
        for name in found.meta.files:
            if name.endswith(".pt"):
                torch.load(os.path.join(found.folder, name), weights_only=True)
        # Continue on one process (another layout): the newest complete checkpoint is taken.
        proc = subprocess.run(_cmd(1, run_dir, "training.load=auto",
                                   f"training.train_iters={found.step + 1}"),
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"resumed from {found.folder} at step {found.step}" in proc.stderr
    assert hit >= 2, f"only {hit} of {len(trials)} kills landed inside a save"


def test_a_damaged_shard_names_the_file_and_the_last_good_checkpoint(tmp_path, env):
    run_dir = tmp_path / "run"
    proc = subprocess.run(_cmd(1, run_dir, "training.train_iters=2", "training.save_interval=1",
                               "model.hidden_size=64"),
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = (run_dir / "config.yaml").read_bytes()
    shard = run_dir / "checkpoints" / "step_0000002" / "shards" / "tp00_pp000_dp00000.pt"
    shard.write_bytes(b"\x00" * shard.stat().st_size)  # same size: only reading finds it
    proc = subprocess.run(_cmd(1, run_dir, "training.train_iters=4", "training.load=auto",
                               "model.hidden_size=64"),
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert str(shard) in proc.stderr and "Traceback" not in proc.stderr
    assert str(run_dir / "checkpoints" / "step_0000001") in proc.stderr  # the last good one
    assert (run_dir / "config.yaml").read_bytes() == config  # a failed start changes nothing


def test_a_second_run_on_one_directory_is_refused(tmp_path, env):
    run_dir = tmp_path / "run"
    first = subprocess.Popen(_cmd(1, run_dir, "training.train_iters=100000",
                                  "model.hidden_size=64"),
                             cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not (run_dir / "metrics.jsonl").exists() and time.time() < deadline:
            time.sleep(0.1)
        second = subprocess.run(_cmd(1, run_dir, "training.train_iters=1",
                                     "model.hidden_size=64"),
                                cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    finally:
        first.kill()
        first.wait()
    assert second.returncode == 2, second.stderr[-3000:]
    assert "is in use by another run" in second.stderr and f"pid {first.pid}" in second.stderr
    assert "Traceback" not in second.stderr


def test_run_dir_that_is_a_file(tmp_path, env):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    proc = subprocess.run(_cmd(1, a_file, "training.train_iters=1"), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "is a file, not a directory" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_wall_clock_saves_keep_the_newest_and_log_each_save(tmp_path, env):
    """training.save_interval_minutes (here 0.6 ms: every step is due) with keep_last=2: each
    step commits, only the two newest remain, and every save is a metrics line."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(_cmd(1, run_dir, "training.train_iters=5", "model.hidden_size=64",
                               "training.save_interval_minutes=0.00001", "training.keep_last=2"),
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept = [os.path.basename(f) for _, f in store.committed(str(run_dir / "checkpoints"))]
    assert kept == ["step_0000005", "step_0000004"]
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    saves = [r for r in lines if r.get("event") == "save"]
    assert [r["step"] for r in saves] == [1, 2, 3, 4, 5]
    assert all(r["gb"] > 0 and r["seconds"] > 0 and r["gb_per_s"] > 0 for r in saves)
