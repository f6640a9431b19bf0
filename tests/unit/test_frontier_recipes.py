"""examples/frontier: every recipe loads strictly and validates for the world its launch line
implies (nodes x ranks per node of train.sbatch), carries the paper's shapes and optimizer, and
the launcher and environment scripts hold the Frontier conventions."""
import os
import re
import subprocess

import pytest

from megatron.config import load_config, validate_for_world

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


def launch_nodes(recipe: str) -> int:
    match = re.search(r"^# launch: sbatch --nodes=(\d+) examples/frontier/train\.sbatch "
                      rf"examples/frontier/{re.escape(recipe)}$", read(os.path.join(FRONTIER, recipe)),
                      re.MULTILINE)
    assert match, f"{recipe} has no '# launch: sbatch --nodes=N ...' line"
    return int(match.group(1))


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
    assert 'source "${MEGATRON_HOME}/examples/frontier/env.sh"' in text
    assert subprocess.run(["bash", "-n", SBATCH]).returncode == 0


def test_env_sh_exports_under_strict_bash():
    out = subprocess.run(["bash", "-c", f"set -euo pipefail; unset LD_LIBRARY_PATH; "
                          f"source {ENV_SH}; env"], capture_output=True, text=True,
                         env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                              "USER": "me", "SLURM_JOB_ID": "42"})
    assert out.returncode == 0, out.stderr
    env = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    assert env["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"
    assert env["NCCL_NET_GDR_LEVEL"] == "3"
    assert env["FI_CXI_DEFAULT_CQ_SIZE"] == "131072"
    assert env["FI_MR_CACHE_MONITOR"] == "userfaultfd"
    assert env["OMP_NUM_THREADS"] == "1" and env["PYTORCH_ROCM_ARCH"] == "gfx90a"
    assert env["MIOPEN_USER_DB_PATH"] == "/tmp/me-miopen-42"
    assert env["LD_LIBRARY_PATH"] == env["AWS_OFI_RCCL_DIR"] + "/lib"
    assert "aws-ofi-rccl" in env["AWS_OFI_RCCL_DIR"]
