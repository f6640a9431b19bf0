"""examples/frontier run: the planner's command on each recipe's launch line, train.sbatch and
env.sh through bash (syntax, strict sourcing, module loads, run root, striping, the environment
tarball). The recipes and scripts read in this process:
tests/unit/test_config_frontier_recipes.py."""
import os
import re
import subprocess

import pytest

from megatron.launch import frontier_env
from tests.support.frontier import ENV_SH, FRONTIER, RECIPES, SBATCH, launch_line, read


@pytest.mark.parametrize("recipe", sorted(RECIPES) + ["mixtral-8x7b.yaml",
                                                      "llama3.1-8b-cpt.yaml"])
def test_the_signal_margin_holds_two_predicted_steps_and_a_save(recipe):
    """A step of these models takes minutes: --signal's margin must let the step under way end
    and a save fit (planner/emit.signal_margin_s of the planner's predicted step, within 20%)."""
    import subprocess
    import sys
    from megatron.planner.emit import signal_margin_s
    nodes, margin = launch_line(recipe)
    out = subprocess.run([sys.executable, "-m", "megatron.cli.plan", "memory", "--config",
                          os.path.join(FRONTIER, recipe), "--cluster", "frontier", "--nodes",
                          str(nodes)], capture_output=True, text=True, timeout=120).stdout
    step = float(re.search(r"^step ([0-9.]+) s", out, re.MULTILINE).group(1))
    assert margin >= 0.8 * signal_margin_s(step), (recipe, step, margin)


def test_the_frontier_scripts_pass_shellcheck():
    """env.sh (generated), train.sbatch and chain.sh: no shellcheck finding at any severity."""
    import shutil
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed (make toolchains installs it as root)")
    scripts = [ENV_SH, SBATCH, os.path.join(FRONTIER, "chain.sh")]
    proc = subprocess.run(["shellcheck", *scripts], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_sbatch_conventions():
    text = read(SBATCH)
    assert "srun --ntasks-per-node=8 --gpus-per-node=8 --gpu-bind=closest -c 7" in text
    assert "python -m megatron.cli.train --config \"${CONFIG}\"" in text
    assert "#SBATCH --signal=USR1@300" in text
    for option in frontier_env.SBATCH_OPTIONS:  # FI_CXI_RDZV_PROTO=alt_read needs it
        assert f"#SBATCH {option}" in text
    assert 'source "${MEGATRON_HOME}/examples/frontier/env.sh"' in text
    assert 'RUN_DIR=$(megatron_run_dir "${CONFIG}")' in text
    assert 'megatron_prepare_run_dir "${RUN_DIR}"' in text and "megatron_prepare_nodes" in text
    assert "torchrun" not in text.split("set -euo pipefail")[1]  # srun's tasks are the ranks
    assert subprocess.run(["bash", "-n", SBATCH]).returncode == 0


# --- env.sh: generated from megatron/launch/frontier_env.py, sourced under strict bash --------

def source_env(extra=None, after="", path=None):
    """(returncode, {exported variables}, stderr) of `source env.sh; <after>; env`."""
    env = {"PATH": path or os.environ.get("PATH", "/usr/bin:/bin"), "USER": "me",
           "SLURM_JOB_ID": "42", "HOME": "/nonexistent"}
    env.update(extra or {})
    out = subprocess.run(["bash", "-c", f"set -euo pipefail; source {ENV_SH}; {after}\nenv"],
                         capture_output=True, text=True, env=env)
    exported = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    return out.returncode, exported, out.stderr


def test_env_sh_is_generated_from_the_one_source():
    assert read(ENV_SH) == frontier_env.env_script(), (
        "examples/frontier/env.sh differs from megatron/launch/frontier_env.py; regenerate: "
        "python -c \"from megatron.launch import frontier_env as f; "
        "f.write_env_sh('examples/frontier/env.sh')\"")
    assert subprocess.run(["bash", "-n", ENV_SH]).returncode == 0


# The settings the current guidance recommends (REFERENCE.md, "Frontier job realities"; checked
# against OLCF pytorch_frontier.rst and HPE's rccl_tuning_guide.md).
RECOMMENDED = {
    "NCCL_SOCKET_IFNAME": "hsn0,hsn1,hsn2,hsn3", "NCCL_NET_GDR_LEVEL": "PHB",
    "NCCL_CROSS_NIC": "1", "HSA_FORCE_FINE_GRAIN_PCIE": "1", "FI_MR_CACHE_MONITOR": "kdreg2",
    "FI_CXI_DISABLE_HOST_REGISTER": "1", "FI_CXI_DEFAULT_CQ_SIZE": "131072",
    "FI_CXI_RDZV_PROTO": "alt_read", "FI_CXI_RDZV_EAGER_SIZE": "0",
    "FI_CXI_RDZV_THRESHOLD": "0", "FI_CXI_RDZV_GET_MIN": "0", "FI_CXI_DEFAULT_TX_SIZE": "2048",
    "FI_CXI_RX_MATCH_MODE": "hybrid", "OMP_NUM_THREADS": "1", "PYTORCH_ROCM_ARCH": "gfx90a",
}


def test_env_sh_exports_under_strict_bash():
    rc, env, err = source_env({"SLURM_JOB_NUM_NODES": "2"})
    assert rc == 0, err
    for name, value in RECOMMENDED.items():
        assert env.get(name) == value, name
    assert env["MIOPEN_USER_DB_PATH"] == env["MIOPEN_CUSTOM_CACHE_DIR"] == "/tmp/me-miopen-42"
    assert env["NCCL_NET"] == "OFI"


@pytest.mark.parametrize("nodes, preset, expected", [
    ("2", None, "OFI"),              # a missing plugin becomes an error, not TCP sockets
    ("1", None, "Socket"),           # one node: Frontier's network is not set up for it
    (None, None, None),              # outside a job: left alone
    ("4", "AWS Libfabric", "AWS Libfabric"),  # an older plugin's name, set on purpose
])
def test_env_sh_nccl_net(nodes, preset, expected):
    extra = {k: v for k, v in (("SLURM_JOB_NUM_NODES", nodes), ("NCCL_NET", preset)) if v}
    rc, env, err = source_env(extra)
    assert rc == 0, err
    assert env.get("NCCL_NET") == expected


# Like Lmod's, it reads an unset variable: env.sh must relax `set -u` around it.
FAKE_MODULE = 'module() {{ : $LMOD_UNSET; echo "module $*" >> {log}; ' \
    '[ "$2" != {fail} ] || return 1; }}; export -f module'


def modules_loaded(tmp_path, fail="none", **extra):
    log = tmp_path / "modules.log"
    cmd = ["bash", "-c", FAKE_MODULE.format(log=log, fail=fail) +
           f"; set -euo pipefail; source {ENV_SH}; env"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "USER": "me", **extra}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    loaded = log.read_text().split("\n") if log.exists() else []
    exported = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    return out.returncode, [m[len("module load "):] for m in loaded if m], exported, out.stderr


def test_env_sh_loads_a_named_rocm_stack(tmp_path):
    rc, loaded, _, err = modules_loaded(tmp_path)
    assert rc == 0, err
    assert loaded == ["PrgEnv-gnu/8.7.0", "cpe/26.03", "rocm/7.1.1", "craype-accel-amd-gfx90a",
                      "rccl-net-plugin"]


def test_env_sh_modules_are_overridable(tmp_path):
    rc, loaded, _, err = modules_loaded(tmp_path, MEGATRON_ROCM_VERSION="6.2.4")
    assert rc == 0 and "rocm/6.2.4" in loaded, err
    (tmp_path / "modules.log").unlink()
    rc, loaded, _, err = modules_loaded(tmp_path, MEGATRON_MODULES="")
    assert rc == 0 and loaded == [], err


def test_env_sh_own_plugin_build_replaces_the_module(tmp_path):
    rc, loaded, env, err = modules_loaded(tmp_path, AWS_OFI_RCCL_DIR="/opt/ofi")
    assert rc == 0, err
    assert "rccl-net-plugin" not in loaded
    assert env["NCCL_NET_PLUGIN"] == "/opt/ofi/lib/librccl-net.so"
    assert env["LD_LIBRARY_PATH"].split(":")[0] == "/opt/ofi/lib"
    assert "has no lib/librccl-net.so" in err  # said at once; the trainer's preflight refuses


def test_env_sh_failed_module_load_stops(tmp_path):
    rc, _, _, err = modules_loaded(tmp_path, fail="rocm/7.1.1")
    assert rc != 0 and "module load rocm/7.1.1 failed" in err


@pytest.mark.parametrize("extra, root", [
    ({"MEMBERWORK": "/lustre/orion/scratch/me", "SLURM_JOB_ACCOUNT": "ABC123"},
     "/lustre/orion/scratch/me/abc123/megatron-runs"),
    ({"PROJWORK": "/lustre/orion/proj-shared", "MEGATRON_PROJECT": "xyz9"},
     "/lustre/orion/proj-shared/xyz9/megatron-runs"),
    ({"MEMBERWORK": "/m", "SLURM_JOB_ACCOUNT": "a1", "RUN_ROOT": "/elsewhere"}, "/elsewhere"),
    ({"MEGATRON_HOME": "/repo"}, "/repo/runs"),
])
def test_run_root_prefers_scratch_and_says_so(extra, root):
    rc, env, err = source_env(extra, after="echo ROOT=$(megatron_run_root)")
    assert rc == 0, err
    assert env["ROOT"] == root
    assert "run directories under" in err


def test_run_dir_is_one_per_recipe_and_a_runs_config_yaml_continues_that_run(tmp_path):
    """megatron_run_dir (train.sbatch's RUN_DIR): RUN_DIR when set; <run root>/<recipe name>;
    and for a run's own config.yaml (its folder holds checkpoints/), that run's folder, not a
    new run under the root named "config"."""
    run = tmp_path / "runs" / "a"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("{}\n")
    (tmp_path / "config.yaml").write_text("{}\n")  # a config.yaml that is not a run's
    home = {"MEGATRON_HOME": "/repo"}
    for config, extra, want in (
            ("examples/frontier/175b.yaml", {}, "/repo/runs/175b"),
            (str(run / "config.yaml"), {}, str(run)),
            (str(tmp_path / "config.yaml"), {}, "/repo/runs/config"),
            (str(run / "config.yaml"), {"RUN_DIR": "/elsewhere"}, "/elsewhere")):
        rc, env, err = source_env({**home, **extra},
                                  after=f"echo DIR=$(megatron_run_dir {config})")
        assert rc == 0 and env["DIR"] == want, (config, env.get("DIR"), err)
        assert ("continuing that run" in err) == (want == str(run)), err


def fake_tools(tmp_path, *names):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho "{name} $*" >> {tmp_path}/calls.log\n')
        tool.chmod(0o755)
    return f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"


def test_checkpoints_striped_only_when_asked(tmp_path):
    path = fake_tools(tmp_path, "lfs")
    run = tmp_path / "run"
    rc, _, err = source_env(path=path, after=f"megatron_prepare_run_dir {run}")
    assert rc == 0, err
    assert (run / "checkpoints").is_dir()
    assert "setstripe" not in (tmp_path / "calls.log").read_text()  # Orion: PFL left alone
    rc, _, err = source_env({"MEGATRON_CKPT_STRIPE": "-c 8 -S 1M -p capacity"}, path=path,
                            after=f"megatron_prepare_run_dir {run}")
    assert rc == 0, err
    assert f"lfs setstripe -c 8 -S 1M -p capacity {run}/checkpoints" in \
        (tmp_path / "calls.log").read_text()


def test_env_tarball_is_broadcast_to_nvme(tmp_path):
    path = fake_tools(tmp_path, "sbcast", "srun")
    nvme, tarball = tmp_path / "nvme", tmp_path / "env.tar.gz"
    tarball.write_text("packed")
    (nvme / "megatron-env" / "bin").mkdir(parents=True)
    (nvme / "megatron-env" / "bin" / "activate").write_text("export ACTIVATED=yes\n")
    rc, env, err = source_env({"MEGATRON_ENV_TARBALL": str(tarball), "MEGATRON_NVME_DIR": str(nvme),
                               "SLURM_JOB_NUM_NODES": "3", "SLURM_NTASKS": "24"},
                              path=path, after="megatron_prepare_nodes")
    assert rc == 0, err
    calls = (tmp_path / "calls.log").read_text()
    assert f"sbcast -pf {tarball} {nvme}/megatron-env.tar.gz" in calls
    assert (f"srun --nodes=3 --ntasks=3 --ntasks-per-node=1 tar -xzf {nvme}/megatron-env.tar.gz "
            f"-C {nvme}/megatron-env") in calls  # once a node, not SLURM_NTASKS times
    assert env["ACTIVATED"] == "yes"


def test_env_tarball_without_nvme_is_one_message(tmp_path):
    tarball = tmp_path / "env.tar.gz"
    tarball.write_text("packed")
    rc, _, err = source_env({"MEGATRON_ENV_TARBALL": str(tarball),
                             "MEGATRON_NVME_DIR": str(tmp_path / "absent")},
                            path=fake_tools(tmp_path, "srun", "sbcast"),
                            after="megatron_prepare_nodes")
    assert rc != 0 and "submit with -C nvme" in err
