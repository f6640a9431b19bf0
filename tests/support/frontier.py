"""examples/frontier as the tests read it: its paths, the recipes' expected shapes and layouts,
and the launch lines of train.sbatch and of each recipe."""
import os
import re

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
