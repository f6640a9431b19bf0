"""The MEGATRON_* environment variables this framework reads, each with what it does, and the one
check of a job's environment against them: a variable with the prefix that nothing reads (a
misspelling: MEGATRON_CHAIN_MAX_ATTEMPT, MEGATRON_PLUGIN) would otherwise do nothing, silently.
megatron-train (rank 0) and the job chain's begin name each such variable in one warning, with
the known name it is closest to. docs/config.md lists the table (tools/config_reference.py).
Standard library only (the chain reads it without torch)."""
from __future__ import annotations

import difflib
from typing import Dict, List, Mapping

PREFIX = "MEGATRON_"

# name -> what reads it and what it does (one line each, for the docs)
KNOWN: Dict[str, str] = {
    "MEGATRON_PLUGINS": "comma-separated modules every command imports first (model variants, "
                        "schedules, kernels of your own: config/plugins.py); not recorded in "
                        "the run, unlike run.plugins",
    "MEGATRON_JOB_END_TIME": "the job's end (Unix seconds; env.sh's megatron_job_deadline): "
                             "training commits a checkpoint and exits 0 while a step and a save "
                             "still fit (training/clock.py)",
    "MEGATRON_FORCE_CPU": "1: train on the CPU although a GPU is visible (launch/device.py)",
    "MEGATRON_NET_PREFLIGHT": "auto, off or always: the start-up check of the network settings "
                              "(launch/preflight.py)",
    "MEGATRON_HEALTH_CHECK": "a command each node runs in its health check; non-zero fails the "
                             "node (launch/health.py)",
    "MEGATRON_HEALTH_MIN_GBPS": "the slowest node-local all-reduce a healthy node may show, "
                                "GB/s (launch/health.py; 5 on GPUs, 0.01 on CPUs)",
    "MEGATRON_CHAIN": "0: this job only, the chain submits no next job (training/chain.py)",
    "MEGATRON_CHAIN_ATTEMPT": "set by the chain: this job's number in it",
    "MEGATRON_CHAIN_MAX_ATTEMPTS": "jobs in one chain, counting the first (20)",
    "MEGATRON_CHAIN_FAILURES": "set by the chain: jobs in a row before this one that failed "
                               "without progress",
    "MEGATRON_CHAIN_MAX_FAILURES": "such failures in a row before the chain stops (3)",
    "MEGATRON_CHAIN_MAX_EXCLUDED": "bad nodes the chain leaves out of the next job at most (8)",
    "MEGATRON_CHAIN_SCRIPT": "the batch script the chain submits again (default: the job's, "
                             "from squeue)",
    "MEGATRON_CHAIN_SRUN_LOG": "set by chain.sh: the file holding srun's stderr, read for the "
                               "task that died first",
    "MEGATRON_CHAIN_CONTINUE": "chain.sh's shell array: --set checkpoint.load=auto in the "
                               "chain's later jobs",
    "MEGATRON_HOME": "the repository the Frontier scripts run from (default: the submit "
                     "folder)",
    "MEGATRON_ROCM_VERSION": "the rocm module env.sh loads; must match the torch wheel's ROCm",
    "MEGATRON_MODULES": "the modules env.sh loads; \"\" loads none",
    "MEGATRON_PROJECT": "the Orion project folder of the run root (default: the job's account)",
    "MEGATRON_CKPT_STRIPE": "lfs setstripe options env.sh applies to checkpoints/",
    "MEGATRON_ENV_TARBALL": "a conda-pack archive of the Python environment, unpacked on every "
                            "node's NVMe",
    "MEGATRON_NVME_DIR": "where the node's NVMe is mounted (/mnt/bb/$USER)",
    "MEGATRON_SKIP_CUDA_WHEEL": "1: make test-fast's skip of the CUDA wheel build (tests only)",
    "MEGATRON_CUDA_TORCH": "the CUDA torch the wheel test installs (tests only)",
    "MEGATRON_MEASURED_LAYOUTS": "the layouts the planner's measured-peak test trains (tests "
                                 "only)",
}
# the test suite's fault injections and stand-ins (tests/support), never a user's setting
TEST_PREFIX = "MEGATRON_TEST_"


def unknown(environ: Mapping[str, str]) -> List[str]:
    """One line for each MEGATRON_* variable of `environ` that nothing reads, with the known
    name closest to it."""
    lines = []
    for name in sorted(environ):
        if not name.startswith(PREFIX) or name in KNOWN or name.startswith(TEST_PREFIX):
            continue
        close = difflib.get_close_matches(name, KNOWN, n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]}?)" if close else ""
        lines.append(f"{name}={environ[name]!r}{hint}")
    return lines


def unknown_note(environ: Mapping[str, str]) -> str:
    """The warning for unknown(): empty when every MEGATRON_* variable is read."""
    lines = unknown(environ)
    if not lines:
        return ""
    return (f"environment variable(s) that nothing in this framework reads, so they do nothing: "
            f"{'; '.join(lines)}. The variables it reads are listed in docs/config.md "
            "(\"Environment variables\")")
