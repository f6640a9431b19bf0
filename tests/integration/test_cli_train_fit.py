"""megatron-train as a process refuses a model predicted not to fit before it allocates it (one
clear error within seconds instead of an allocator traceback or the OOM killer), and with
training.check_memory=false starts it anyway. The decision itself: tests/unit/test_planner_fit.py."""
import re
import resource
import subprocess
import time

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
    proc = run_cli(["--config", TINY, *sets("training.train_iters=1", "training.tensorboard=false",
                                            f"run.dir={tmp_path / 'run'}")],
                   clean_env(MEGATRON_FORCE_CPU="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"memory check: predicted 0\.\d+ GB per rank of \d+\.\d GB \(MemAvailable",
                     proc.stderr), proc.stderr[-3000:]
