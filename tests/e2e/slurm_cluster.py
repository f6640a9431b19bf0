"""A real Slurm for the end-to-end tests: slurmctld and two slurmd daemons playing nodes n1 and n2
(both on 127.0.0.1), started from a slurm.conf in a temp dir (the session fixture `slurm` in
conftest.py), and helpers to submit a batch script and wait for jobs."""
import contextlib
import getpass
import glob
import os
import random
import re
import shutil
import socket
import subprocess
import time

import pytest

from tests.support.paths import ROOT
from tests.support.procs import PORT_ATTEMPTS, free_port, port_taken

BINARIES = ("slurmctld", "slurmd", "sbatch", "srun", "sinfo", "scontrol", "scancel")
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "PREEMPTED"}

CONF = """ClusterName=megatrontest
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmUser={user}
SlurmdUser={user}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
FirstJobId={first_job_id}
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port={n1_port} CPUs=2 State=UNKNOWN
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port={n2_port} CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
"""


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def first_job_id() -> int:
    """A job id whose derived rendezvous port (20000 + id % 10000, env.py) is free now."""
    for _ in range(100):
        port = random.randint(20001, 29998)
        if port_is_free(port) and port_is_free(port + 1):
            return port - 20000
    pytest.skip("no free port in 20000-29999 for the Slurm job's derived rendezvous port")


def tail(path, n: int = 15) -> str:
    try:
        with open(path) as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no log)"


def wait_idle(env, daemons, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(proc.poll() is not None for proc in daemons):
            return False
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True,
                             text=True, env=env).stdout.split()
        states = dict(zip(out[::2], out[1::2]))
        if states.get("n1") == "idle" and states.get("n2") == "idle":
            return True
        time.sleep(0.3)
    return False


def wait_job(job_id: int, env, timeout: float):
    """(JobState, ExitCode) once the job has ended. Polled here because `sbatch --wait` checks
    with growing sleeps, which adds seconds to a job this short."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["scontrol", "-o", "show", "job", str(job_id)], capture_output=True,
                             text=True, env=env).stdout
        fields = dict(re.findall(r"(JobState|ExitCode)=(\S+)", out))
        if fields.get("JobState") in ENDED:
            return fields["JobState"], fields.get("ExitCode")
        time.sleep(0.25)
    subprocess.run(["scancel", str(job_id)], env=env)
    pytest.fail(f"Slurm job {job_id} did not finish within {timeout:.0f} s")


@contextlib.contextmanager
def cluster(d):
    """Starts the daemons with their files in the directory d; yields {"conf", "dir"}; skips the
    test when Slurm is missing or does not come up."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        pytest.skip(f"Slurm binaries missing ({', '.join(missing)}): "
                    "apt-get install slurm-wlm (or `make toolchains`)")
    (d / "state").mkdir()
    conf = d / "slurm.conf"
    env = dict(os.environ, SLURM_CONF=str(conf))
    daemons = []
    try:
        # The ports are free when picked; another test's launch may take one before a daemon
        # binds it. Such a start is retried on fresh ports; any other failure skips at once.
        for attempt in range(PORT_ATTEMPTS):
            conf.write_text(CONF.format(d=d, user=getpass.getuser(), ctld_port=free_port(),
                                        n1_port=free_port(), n2_port=free_port(),
                                        first_job_id=first_job_id()))
            daemons = _start(conf, env)
            if wait_idle(env, daemons):
                break
            logs = [tail(d / name, 10 ** 6) for name in LOGS]
            _stop(daemons)
            daemons = []
            if attempt + 1 < PORT_ATTEMPTS and port_taken("\n".join(logs)):
                for name in LOGS:
                    (d / name).unlink(missing_ok=True)
                continue
            pytest.skip("Slurm did not come up (a daemon exited, or nodes n1, n2 were not idle "
                        "within 30 s); "
                        f"slurmctld log:\n{tail(d / 'slurmctld.log')}\n"
                        f"slurmd n1 log:\n{tail(d / 'slurmd-n1.log')}")
        started = time.time()
        yield {"conf": str(conf), "dir": d}
    finally:
        _stop(daemons)
        if daemons:
            _remove_job_folders(started)


def _remove_job_folders(since: float) -> None:
    """The node-local MIOpen folders the recipes' megatron_prepare_nodes made for this
    cluster's jobs (examples/frontier/env.sh: /tmp/<user>-miopen-<job id>), left empty on a
    machine without MIOpen: they piled up in /tmp, one per test job."""
    for folder in glob.glob("/tmp/*-miopen-[0-9]*"):
        try:
            if os.stat(folder).st_mtime >= since - 1 and not os.listdir(folder):
                os.rmdir(folder)
        except OSError:
            pass  # another session's, or gone


LOGS = ("slurmctld.log", "slurmd-n1.log", "slurmd-n2.log")


def _start(conf, env):
    daemons = [subprocess.Popen(["slurmctld", "-D", "-c", "-f", str(conf)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    for node in ("n1", "n2"):
        daemons.append(subprocess.Popen(["slurmd", "-D", "-N", node, "-f", str(conf)], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return daemons


def _stop(daemons):
    for proc in daemons:
        proc.terminate()
    for proc in daemons:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def submit(slurm, run_env, script_text: str, tmp_path, timeout: float = 300):
    """(JobState, ExitCode, job output, seconds from submission to end) of a batch script."""
    job_out = tmp_path / "job.out"
    script = tmp_path / "job.sbatch"
    script.write_text(script_text.replace("@OUT@", str(job_out)))
    env = dict(run_env.env, SLURM_CONF=slurm["conf"])
    start = time.monotonic()
    proc = subprocess.run(["sbatch", "--parsable", f"--chdir={ROOT}", str(script)],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    state, code = wait_job(int(proc.stdout.strip().split(";")[0]), env, timeout)
    return state, code, tail(job_out, 10 ** 6), time.monotonic() - start
