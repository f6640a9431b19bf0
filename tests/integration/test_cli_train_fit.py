"""megatron-train as a process refuses a model predicted not to fit before it allocates it (one
clear error within seconds instead of an allocator traceback or the OOM killer), and with
training.check_memory=false starts it anyway. The decision itself: tests/unit/test_planner_fit.py."""
import os
import re
import resource
import subprocess
import time

import pytest

from tests.support.cli import assert_clean_error, clean_env, run_cli, sets, train_cmd
from tests.support.paths import ROOT, TINY

# 154.6B parameters: about 4 TB of fp32 states and Adam moments on one rank.
HUGE = sets("model.hidden_size=16384", "model.num_layers=48", "model.num_attention_heads=128")
# Enough address space for the interpreter, torch and DeepSpeed, far too little for the model:
# a run that gets past the check fails in the allocator within seconds instead of filling RAM.
ADDRESS_SPACE = 4 * 2 ** 30


def test_a_model_that_cannot_fit_is_refused_within_seconds(tmp_path):
    started = time.monotonic()
    proc = run_cli(["--config", TINY, *HUGE, *sets(f"run.dir={tmp_path / 'run'}")],
                   clean_env(MEGATRON_FORCE_CPU="1"))
    elapsed = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert_clean_error(proc, "megatron-train: error: this job is predicted not to fit in memory",
                       "GB per rank", "weights 576.1", "optimizer states", "the CPU has",
                       "MemAvailable", "parallel.tensor_parallel_size", "parallel.zero_stage=3",
                       "training.activation_checkpointing=full", "training.micro_batch_size",
                       "--set training.check_memory=false")
    assert elapsed < 30, f"the refusal took {elapsed:.1f} s"
    assert not (tmp_path / "run").exists(), "the refused run created its run directory"


def _limit_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def test_check_memory_false_starts_it_anyway(tmp_path):
    """What happens after the check (here the allocator's refusal) is not this test's concern:
    only that the check warned and let the run through."""
    cmd = train_cmd("--config", TINY, *HUGE, *sets("training.check_memory=false",
                                                   "training.tensorboard=false",
                                                   f"run.dir={tmp_path / 'run'}"))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=clean_env(MEGATRON_FORCE_CPU="1"), preexec_fn=_limit_address_space)
    assert "training.check_memory=false, starting anyway: this job is predicted not to fit" \
        in proc.stderr, proc.stderr[-3000:]
    assert "megatron-train: error: this job is predicted" not in proc.stderr


def test_a_model_that_fits_logs_its_prediction_and_trains(tmp_path):
    """...and names, once each, what it will not read: a setting another turns off
    (config/unused.py) and a MEGATRON_* variable nothing reads (config/environ.py)."""
    proc = run_cli(["--config", TINY, *sets("training.train_iters=1", "training.tensorboard=false",
                                            f"run.dir={tmp_path / 'run'}", "eval.eval_iters=7")],
                   clean_env(MEGATRON_FORCE_CPU="1", MEGATRON_PLUGIN="mypkg.variants"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"memory check: predicted 0\.\d+ GB per rank of \d+\.\d GB \(MemAvailable",
                     proc.stderr), proc.stderr[-3000:]
    assert proc.stderr.count("eval.eval_iters=7 (eval.eval_interval=0: no evaluation)") == 1
    assert proc.stderr.count("nothing in this framework reads, so they do nothing: "
                             "MEGATRON_PLUGIN='mypkg.variants' (did you mean MEGATRON_PLUGINS?)"
                             ) == 1, proc.stderr[-3000:]


# About 5.4 GB predicted on a CPU: fits this machine's free memory, not a 2 GB job limit.
MIDDLE = sets("model.hidden_size=2048", "model.num_layers=4", "model.num_attention_heads=16")


def _own_cgroup_v2():
    """This process's cgroup v2 directory where it controls memory, or None (cgroup v1, or a
    hybrid system whose memory controller is on v1)."""
    with open("/proc/self/cgroup") as f:
        rel = next((line[3:].strip().lstrip("/") for line in f if line.startswith("0::")), None)
    for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        path = os.path.join(mount, rel or "")
        try:
            with open(os.path.join(path, "cgroup.controllers")) as f:
                if rel is not None and "memory" in f.read().split():
                    return path
        except OSError:
            continue
    return None


@pytest.fixture
def cgroup_2g():
    """A child of this process's own cgroup v2 with memory.max = 2 GiB, removed after."""
    parent = _own_cgroup_v2()
    if parent is None:
        pytest.skip("this process has no cgroup v2 memory controller (cgroup v1 or hybrid)")
    child = os.path.join(parent, f"megatron-fit-test-{os.getpid()}")
    try:
        os.mkdir(child)
        with open(os.path.join(child, "memory.max"), "w") as f:
            f.write(str(2 * 2 ** 30))
    except OSError as e:
        if os.path.isdir(child):
            os.rmdir(child)
        pytest.skip(f"cgroup v2 is not writable here ({parent}: {e})")
    yield child
    os.rmdir(child)


def test_under_a_2_gb_cgroup_the_job_is_refused_naming_the_limit(tmp_path, cgroup_2g):
    def enter():
        with open(os.path.join(cgroup_2g, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    cmd = train_cmd("--config", TINY, *MIDDLE, *sets(f"run.dir={tmp_path / 'run'}"))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=clean_env(MEGATRON_FORCE_CPU="1"), preexec_fn=enter)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert_clean_error(proc, "this job is predicted not to fit in memory",
                       f"cgroup {cgroup_2g}/memory.max = 2.00 GB")


def test_under_an_address_space_limit_the_job_is_refused_naming_it(tmp_path):
    """RLIMIT_AS (ulimit -v) is per process: what it leaves is the limit less the address space
    the interpreter, torch and DeepSpeed already hold."""
    cmd = train_cmd("--config", TINY, *MIDDLE, *sets(f"run.dir={tmp_path / 'run'}"))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=clean_env(MEGATRON_FORCE_CPU="1"), preexec_fn=_limit_address_space)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert_clean_error(proc, "this job is predicted not to fit in memory",
                       "RLIMIT_AS (ulimit -v) = 4.00 GB")
    assert not (tmp_path / "run").exists(), "the refused run created its run directory"
