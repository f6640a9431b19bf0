"""A real Slurm on this machine: slurmctld and two slurmd daemons playing nodes n1 and n2 (both on
127.0.0.1), started from a slurm.conf under a temp dir for the session. A 2-node, 1-task-per-node
job trains with the rendezvous taken from SLURM_* variables (megatron/launch/env.py) alone,
except MASTER_ADDR=127.0.0.1 because the fake node names do not resolve. A step on part of the
allocation finds its master among its own nodes, and examples/frontier/env.sh in a 2-node job
sets NCCL_NET=OFI, after which the trainer's network preflight refuses a missing plugin. The
cluster: the session fixture `slurm` (conftest.py, slurm_cluster.py)."""
import json
import shutil
import subprocess
import sys

import pytest

from tests.e2e.e2e_helpers import ROOT, TINY, RunEnv, train_steps
from tests.e2e.slurm_cluster import submit, tail, wait_job

pytestmark = pytest.mark.slow


def test_sbatch_srun_two_nodes_trains(slurm, tmp_path):
    run_env, run_dir = RunEnv(tmp_path), tmp_path / "run"
    job_out = tmp_path / "job.out"
    script = tmp_path / "train.sbatch"
    script.write_text(f"""#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output={job_out}
# Fake node names do not resolve; everything else comes from SLURM_* in each task.
export MASTER_ADDR=127.0.0.1
srun {sys.executable} -m megatron.cli.train --config {TINY} \\
    --set training.train_iters=3 --set training.global_batch_size=4 \\
    --set training.tensorboard=false --set run.dir={run_dir}
""")
    env = dict(run_env.env, SLURM_CONF=slurm["conf"])
    proc = subprocess.run(["sbatch", "--parsable", f"--chdir={ROOT}", str(script)],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    job_id = int(proc.stdout.strip().split(";")[0])
    state = wait_job(job_id, env, timeout=300)
    log = tail(job_out, 10 ** 6)
    assert state == ("COMPLETED", "0:0"), f"job ended {state}; job output:\n{log[-4000:]}"
    port = 20000 + job_id % 10000
    assert f"rank 0 of 2 via 127.0.0.1:{port} (slurm, 2 node(s)" in log, log[-4000:]
    run_env.assert_compiled_nothing(log)
    assert train_steps(str(run_dir)) == [1, 2, 3]


PROBE = ("import json, os; from megatron.launch.env import discover; l = discover(); "
         "print('PROBE ' + json.dumps(dict(step=os.environ.get('SLURM_STEP_ID'), "
         "job_nodes=os.environ.get('SLURM_JOB_NODELIST'), rank=l.rank, world=l.world_size, "
         "master=l.master_addr, nodes=l.num_nodes)))")


def test_step_on_part_of_the_allocation_finds_its_master(slurm, tmp_path):
    """Three steps of one 2-node job: all of it, then n1 excluded as a bad node would be, with
    one and with two tasks. The last two must meet on n2, not on the job's first node n1, where
    nothing of theirs listens (before: a 600 s rendezvous timeout)."""
    state, code, log, _ = submit(slurm, RunEnv(tmp_path), f"""#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --output=@OUT@
srun --nodes=2 --ntasks=2 {sys.executable} -c "{PROBE}"
srun --nodes=1 --ntasks=1 --exclude=n1 {sys.executable} -c "{PROBE}"
srun --nodes=1 --ntasks=2 --exclude=n1 {sys.executable} -c "{PROBE}"
""", tmp_path, timeout=120)
    assert (state, code) == ("COMPLETED", "0:0"), log[-4000:]
    seen = [json.loads(line.split("PROBE ", 1)[1]) for line in log.splitlines()
            if line.startswith("PROBE ")]
    by_step = {}
    for probe in seen:
        assert probe["job_nodes"] == "n[1-2]"  # the job's list still starts with n1
        by_step.setdefault(probe["step"], []).append(probe)
    assert sorted(by_step) == ["0", "1", "2"], log[-4000:]
    full, one, two = by_step["0"], by_step["1"], by_step["2"]
    assert sorted((p["rank"], p["master"], p["world"], p["nodes"]) for p in full) == \
        [(0, "n1", 2, 2), (1, "n1", 2, 2)]
    assert [(p["master"], p["world"], p["nodes"]) for p in one] == [("n2", 1, 1)]
    assert sorted((p["rank"], p["master"], p["world"], p["nodes"]) for p in two) == \
        [(0, "n2", 2, 1), (1, "n2", 2, 1)]


def test_frontier_env_and_preflight_refuse_a_missing_plugin(slurm, tmp_path):
    """examples/frontier/env.sh in a real 2-node job (no modules here), pointed at a plugin build
    that is not there: it sets NCCL_NET=OFI, prepares the run directory and every node, and the
    trainer then stops every rank before the rendezvous with one message each, in seconds, having
    trained nothing. This machine has no GPU: MEGATRON_NET_PREFLIGHT=always runs the check
    anyway."""
    run_env, run_root = RunEnv(tmp_path), tmp_path / "runs"
    state, code, log, elapsed = submit(slurm, run_env, f"""#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output=@OUT@
set -euo pipefail
export MEGATRON_MODULES="" AWS_OFI_RCCL_DIR={tmp_path}/no-such-plugin RUN_ROOT={run_root}
source examples/frontier/env.sh
echo "NCCL_NET=$NCCL_NET NCCL_NET_PLUGIN=$NCCL_NET_PLUGIN"
RUN_DIR=$(megatron_run_root)/tiny
megatron_prepare_run_dir "$RUN_DIR"
megatron_prepare_nodes
export MASTER_ADDR=127.0.0.1 MEGATRON_NET_PREFLIGHT=always
srun {sys.executable} -m megatron.cli.train --config {TINY} --set training.train_iters=3 \\
    --set training.global_batch_size=4 --set training.tensorboard=false --set run.dir="$RUN_DIR"
""", tmp_path, timeout=180)
    assert state == "FAILED", log[-4000:]
    assert f"NCCL_NET=OFI NCCL_NET_PLUGIN={tmp_path}/no-such-plugin/lib/librccl-net.so" in log
    prefix = "megatron-train: error: "
    errors = [line for line in log.splitlines() if line.startswith(prefix)]
    assert len(errors) == 2, log[-4000:]  # one message per rank
    # Which library is reported first (libfabric, then the plugin) depends on this machine.
    assert all(e.startswith(prefix + "network preflight: NCCL_NET=OFI asks for the libfabric "
                            "network plugin, but ") and "cannot be loaded" in e for e in errors)
    assert "Traceback" not in log, log[-4000:]
    assert "joining" not in log  # nobody reached the rendezvous
    assert (run_root / "tiny" / "checkpoints").is_dir()
    assert not (run_root / "tiny" / "metrics.jsonl").exists()
    assert elapsed < 90, f"took {elapsed:.0f} s"


def test_frontier_env_stages_the_environment_once_per_node(slurm, tmp_path):
    """megatron_prepare_nodes in a 2-node job with 2 tasks a node: the archive is sbcast, then
    unpacked and conda-unpack'ed once on each node (a bare `srun --ntasks-per-node=1` would
    inherit SLURM_NTASKS=4 and unpack it twice a node, over itself), and the batch shell ends up
    with the NVMe copy activated for the ranks it starts. Both fake nodes share this machine's
    disk, so tar is serialised here with flock."""
    packed = tmp_path / "packed" / "bin"
    packed.mkdir(parents=True)
    (packed / "activate").write_text("export MEGATRON_ENV_ON_NVME=yes\n")
    unpack = packed / "conda-unpack"
    unpack.write_text(f'#!/bin/sh\necho "unpack $SLURMD_NODENAME" >> {tmp_path}/calls.log\n')
    unpack.chmod(0o755)
    tarball = tmp_path / "env.tar.gz"
    subprocess.run(["tar", "-czf", str(tarball), "-C", str(tmp_path / "packed"), "bin"],
                   check=True)
    tools = tmp_path / "tools"
    tools.mkdir()
    tar = tools / "tar"
    tar.write_text(f'#!/bin/sh\necho "tar $SLURMD_NODENAME" >> {tmp_path}/calls.log\n'
                   f'exec flock {tmp_path}/tar.lock {shutil.which("tar")} "$@"\n')
    tar.chmod(0o755)
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    state, code, log, _ = submit(slurm, RunEnv(tmp_path), f"""#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --output=@OUT@
set -euo pipefail
export PATH={tools}:$PATH MEGATRON_MODULES="" MEGATRON_NVME_DIR={nvme}
export MEGATRON_ENV_TARBALL={tarball}
source examples/frontier/env.sh
megatron_prepare_nodes
echo "activated: ${{MEGATRON_ENV_ON_NVME:-no}}"
""", tmp_path, timeout=120)
    assert (state, code) == ("COMPLETED", "0:0"), log[-4000:]
    assert "activated: yes" in log and "can't honor" not in log, log[-4000:]
    calls = sorted((tmp_path / "calls.log").read_text().split("\n"))
    assert [c for c in calls if c] == ["tar n1", "tar n2", "unpack n1", "unpack n2"]
    assert (nvme / "megatron-env.tar.gz").exists()  # what sbcast wrote


def test_a_job_stops_itself_before_its_time_limit(slurm, tmp_path):
    """A 1-minute job with slow steps and no signal: env.sh hands the job's end time to the
    trainer (squeue, MEGATRON_JOB_END_TIME), which commits a checkpoint and exits 0 while one more
    step and a save still fit; Slurm records a completed job, not a timeout."""
    run_env, run_dir = RunEnv(tmp_path), tmp_path / "run"
    state, code, log, elapsed = submit(slurm, run_env, f"""#!/bin/bash
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --time=1
#SBATCH --output=@OUT@
set -euo pipefail
export MEGATRON_MODULES="" RUN_ROOT={tmp_path}
source examples/frontier/env.sh
megatron_job_deadline
echo "deadline $MEGATRON_JOB_END_TIME"
export MASTER_ADDR=127.0.0.1
srun {sys.executable} -m megatron.cli.train --config {TINY} --set training.train_iters=100000 \\
    --set model.hidden_size=256 --set training.log_interval=10 \\
    --set training.tensorboard=false --set run.dir={run_dir}
""", tmp_path, timeout=150)
    assert (state, code) == ("COMPLETED", "0:0"), log[-4000:]
    assert "deadline " in log and "stopping after step" in log, log[-4000:]
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    stop = [r for r in lines if r.get("event") == "stop"]
    saves = [r for r in lines if r.get("event") == "save"]
    assert len(stop) == 1 and stop[0]["reason"] == "deadline"
    assert saves and saves[-1]["step"] == stop[0]["step"] > 1
    assert (run_dir / "checkpoints" / f"step_{stop[0]['step']:07d}" / "meta.json").is_file()
    # COMPLETED, not TIMEOUT, is the proof it stopped before the limit; no wall-clock bound here,
    # since a loaded machine delays the job's start.
