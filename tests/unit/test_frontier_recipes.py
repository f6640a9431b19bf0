"""examples/frontier: every recipe loads strictly and validates for the world its launch line
implies (nodes x ranks per node of train.sbatch), carries the paper's shapes and optimizer, and
the launcher and environment scripts hold the Frontier conventions."""
import os
import re
import subprocess

import pytest

from megatron.config import load_config, validate_for_world
from megatron.launch import frontier_env
from tests.support.paths import ROOT

FRONTIER = os.path.join(ROOT, "examples", "frontier")
SBATCH = os.path.join(FRONTIER, "train.sbatch")
ENV_SH = os.path.join(FRONTIER, "env.sh")

# recipe -> (layers, hidden, heads), (tp, pp), nodes, expected DP
RECIPES = {
    "22b.yaml": ((48, 6144, 48), (2, 4), 8, 8),
    "175b.yaml": ((96, 12288, 96), (4, 16), 16, 2),
    "1t.yaml": ((128, 25600, 200), (8, 64), 128, 2),
}


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def ranks_per_node() -> int:
    """Ranks per node of the training srun line (the other srun makes directories)."""
    match = re.search(r"srun --ntasks-per-node=(\d+) --gpus-per-node", read(SBATCH))
    assert match, "train.sbatch has no training srun line"
    return int(match.group(1))


def launch_line(recipe: str):
    """(nodes, SIGUSR1 margin in seconds) of the recipe's '# launch:' line."""
    match = re.search(r"^# launch: sbatch --nodes=(\d+) --signal=USR1@(\d+) "
                      r"examples/frontier/train\.sbatch "
                      rf"examples/frontier/{re.escape(recipe)}$", read(os.path.join(FRONTIER, recipe)),
                      re.MULTILINE)
    assert match, f"{recipe} has no '# launch: sbatch --nodes=N --signal=USR1@S ...' line"
    return int(match.group(1)), int(match.group(2))


def launch_nodes(recipe: str) -> int:
    return launch_line(recipe)[0]


@pytest.mark.parametrize("recipe", sorted(RECIPES))
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


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_validates_for_its_launch(recipe):
    shape, (tp, pp), nodes, dp = RECIPES[recipe]
    cfg = load_config(os.path.join(FRONTIER, recipe))
    assert launch_nodes(recipe) == nodes
    world = nodes * ranks_per_node()
    assert validate_for_world(cfg, world) == dp
    m = cfg.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads) == shape
    assert (cfg.parallel.tensor_parallel_size, cfg.parallel.pipeline_parallel_size) == (tp, pp)
    assert tp <= 8, "tensor parallelism must stay inside one 8-GCD node"
    assert world % 8 == 0


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_carries_the_papers_training_setup(recipe):
    cfg = load_config(os.path.join(FRONTIER, recipe))
    o, t, m, d = cfg.optimizer, cfg.training, cfg.model, cfg.data
    assert (o.lr, o.min_lr, o.lr_decay_style, o.weight_decay) == (6e-5, 6e-6, "cosine", 0.1)
    assert (o.adam_beta1, o.adam_beta2, t.clip_grad) == (0.9, 0.95, 1.0)
    assert (m.seq_length, m.vocab_size, m.attention_backend) == (2048, 50257, "flash")
    assert (t.precision, t.activation_checkpointing, t.micro_batch_size) == ("bf16", "full", 1)
    assert cfg.parallel.zero_stage == 1 and t.save
    assert (d.synthetic, d.tokenizer_type) == (False, "gpt2")
    assert d.paths and d.vocab_file and d.merges_file


def test_175b_is_the_logged_run():
    cfg = load_config(os.path.join(FRONTIER, "175b.yaml"))
    assert cfg.training.global_batch_size == 1280
    assert validate_for_world(cfg, 128) == 2  # TP4 x PP16 x DP2 on 128 GCDs


def test_1t_head_dim_is_128():
    assert load_config(os.path.join(FRONTIER, "1t.yaml")).model.head_dim == 128


def test_sbatch_conventions():
    text = read(SBATCH)
    assert "srun --ntasks-per-node=8 --gpus-per-node=8 --gpu-bind=closest -c 7" in text
    assert "python -m megatron.cli.train --config \"${CONFIG}\"" in text
    assert "#SBATCH --signal=USR1@300" in text
    for option in frontier_env.SBATCH_OPTIONS:  # FI_CXI_RDZV_PROTO=alt_read needs it
        assert f"#SBATCH {option}" in text
    assert 'source "${MEGATRON_HOME}/examples/frontier/env.sh"' in text
    assert "RUN_DIR=${RUN_DIR:-$(megatron_run_root)/" in text
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


def test_every_setting_cites_its_source():
    lines = read(ENV_SH).splitlines()
    for i, line in enumerate(lines):
        if line.startswith("export ") and any(f"export {s.name}=" in line
                                                for s in frontier_env.SETTINGS):
            comment = []
            for prev in reversed(lines[:i]):
                if not prev.startswith("#"):
                    break
                comment.insert(0, prev)
            cited = " ".join(comment)
            assert re.search(r"\[(OLCF-PT|OLCF-FUG|OLCF-SB|HPE|OFI) ", cited), line


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
