"""A training run compiles nothing: neither our code nor DeepSpeed's op builders (which JIT the
shm collective and the CPU Adam unless told otherwise) may start a compiler. The multi-rank runs
(tests/e2e/test_launch_multinode.py, test_launch_slurm.py) make the same check under their
launchers."""
import socket
import subprocess
import sys

import pytest

from tests.e2e.e2e_helpers import ROOT, TINY, RunEnv, set_args, train_steps

pytestmark = pytest.mark.slow


def test_single_process_compiles_nothing_and_needs_no_port(tmp_path):
    """Holds MASTER_PORT busy too: a world of one must not need a TCP rendezvous, or two
    single-process runs on one machine would collide on it."""
    run_env, run_dir = RunEnv(tmp_path), str(tmp_path / "run")
    args = set_args("training.train_iters=2", "training.global_batch_size=4",
                    "training.tensorboard=false", f"run.dir={run_dir}")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        env = dict(run_env.env, MASTER_PORT=str(busy.getsockname()[1]))
        proc = subprocess.run([sys.executable, "-m", "megatron.cli.train", "--config", TINY]
                              + args, capture_output=True, text=True, env=env, timeout=300,
                              cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_env.assert_compiled_nothing(proc.stdout + proc.stderr)
    assert train_steps(run_dir) == [1, 2]
