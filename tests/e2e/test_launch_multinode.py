"""Two torchrun "nodes" on loopback: two agents, one rank each, meeting through the c10d
rendezvous as two real nodes would. The run must train and compile nothing."""
import shutil
import subprocess
import sys
import time

import pytest

from tests.e2e.e2e_helpers import ROOT, TINY, RunEnv, free_port, set_args, train_steps
from tests.support.procs import PORT_ATTEMPTS, port_taken

pytestmark = pytest.mark.slow


def _launch(tmp_path, run_env, run_dir, attempt):
    """Both nodes on one rendezvous port; (return codes, their logs)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
           f"--rdzv-id=two-nodes-{attempt}", "-m", "megatron.cli.train", "--config", TINY]
    cmd += set_args("training.train_iters=2", "training.global_batch_size=4",
                    "training.tensorboard=false", f"run.dir={run_dir}")
    # Each node writes to its own file: read through pipes one after the other, the node not
    # being read could fill its pipe, block on a write mid-step and stall the other in a
    # collective.
    logs = [tmp_path / f"node{i}.attempt{attempt}.log" for i in range(2)]
    files = [open(log, "w") for log in logs]
    # PYTHONFAULTHANDLER: a process that gets SIGABRT prints every thread's Python stack.
    env = dict(run_env.env, PYTHONFAULTHANDLER="1")
    nodes = [subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True, env=env,
                              cwd=ROOT) for f in files]
    try:
        for node in nodes:
            node.wait(timeout=300)
    except subprocess.TimeoutExpired:
        # A hang (seen once in many runs, not reproduced): have the ranks print where they
        # wait, into the node logs the failure below shows.
        for node in nodes:
            subprocess.run(["pkill", "-ABRT", "-P", str(node.pid)], check=False)
        time.sleep(3)
    finally:
        for node, f in zip(nodes, files):
            if node.poll() is None:
                node.kill()
                node.wait()
            f.close()
    return [node.returncode for node in nodes], [log.read_text() for log in logs]


def test_two_torchrun_nodes_on_loopback(tmp_path):
    run_env, run_dir = RunEnv(tmp_path), str(tmp_path / "run")
    # The endpoint is a port picked in advance (both agents must know it); another test's
    # process may bind it first, and then the start is retried on a fresh port.
    for attempt in range(PORT_ATTEMPTS):
        codes, outputs = _launch(tmp_path, run_env, run_dir, attempt)
        if any(codes) and attempt + 1 < PORT_ATTEMPTS and port_taken("\n".join(outputs)):
            shutil.rmtree(run_dir, ignore_errors=True)
            continue
        break
    for i, (code, out) in enumerate(zip(codes, outputs)):
        assert code == 0, f"node {i}:\n{out[-4000:]}\nother node:\n{outputs[1 - i][-2000:]}"
    joined = "\n".join(outputs)
    assert "rank 0 of 2" in joined, joined[-4000:]
    run_env.assert_compiled_nothing(joined)
    assert train_steps(run_dir) == [1, 2]
