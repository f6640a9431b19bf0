"""A 4-rank worker for tests/integration/test_launch_node_link.py: the link check over a roster of
two nodes (ranks 0-1 on n0, 2-3 on n1) with the default floor and with an impossible one; each
rank writes its verdicts to rank<R>.json in the folder given as its argument (four ranks
printing to one pipe can interleave their lines), and how many process groups the checks
left behind."""
import json
import os
import sys

import torch
import torch.distributed as dist

from megatron.launch.health import MIN_GBPS_ENV, check_node_link
from megatron.parallel.state import live_groups


def main() -> None:
    dist.init_process_group("gloo")
    rank, nodes = dist.get_rank(), ["n0", "n0", "n1", "n1"]
    cpu = torch.device("cpu")
    before = live_groups()
    healthy = check_node_link(nodes, rank, cpu, {})
    broken = check_node_link(nodes, rank, cpu, {MIN_GBPS_ENV: "1e6"})
    left = len(live_groups() - before)  # the nodes' groups the checks made and kept
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "healthy": healthy, "broken": broken, "groups_left": left}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
