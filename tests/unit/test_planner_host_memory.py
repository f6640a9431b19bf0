"""planner/host_memory.py: the host memory a CPU rank may use is the smallest of MemAvailable and
every limit the job runs under (issue 41 item 3). Each test builds a fake /proc and /sys tree; a
failure localizes to the cgroup v2 or v1 reading, the ancestors, the share per rank, RLIMIT_AS,
or megatron-train's refusal naming the limit. As a process under a real
limit: tests/integration/test_cli_train_fit.py."""
import os

import pytest

from megatron.cli import train
from megatron.config import InputError, load_config
from megatron.launch.env import LaunchEnv
from megatron.planner import fit
from megatron.planner.host_memory import cgroup_memory, host_memory, rlimit_memory

from tests.support.paths import TINY

GIB = 2 ** 30
# about 5.4 GB predicted on a CPU: fits the machine's 22.7 GB, not a 2 GB job limit
MIDDLE = ["model.hidden_size=2048", "model.num_layers=4", "model.num_attention_heads=16"]


def _write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def machine(tmp_path, cgroup="0::/job\n", available_gb=22.7):
    root = str(tmp_path)
    _write(root, "proc/meminfo", f"MemTotal: 99999999 kB\nMemAvailable: "
                                 f"{int(available_gb * 2 ** 20)} kB\n")
    _write(root, "proc/self/cgroup", cgroup)
    _write(root, "proc/self/status", "Name:\tpython\nVmSize:\t 1048576 kB\n")
    return root


def test_without_limits_it_is_mem_available(tmp_path):
    root = machine(tmp_path)
    _write(root, "sys/fs/cgroup/job/memory.max", "max\n")
    mem = host_memory(1, root, rlimit=-1)
    assert mem.bytes_per_rank == pytest.approx(22.7 * GIB, rel=1e-6)
    assert mem.source.startswith("MemAvailable")


def test_cgroup_v2_memory_max_less_what_it_holds_wins_and_names_its_file(tmp_path):
    root = machine(tmp_path, "0::/slurm/job_7/step_0\n")
    cg = "sys/fs/cgroup/slurm/job_7/step_0"
    _write(root, f"{cg}/memory.max", f"{2 * GIB}\n")
    _write(root, f"{cg}/memory.current", f"{GIB // 2}\n")
    _write(root, f"{cg}/memory.stat", f"anon 1\ninactive_file {GIB // 4}\nactive_file 9\n")
    mem = host_memory(1, root, rlimit=-1)
    # page cache the kernel can drop is free: 2 - (0.5 - 0.25) GB
    assert mem.bytes_per_rank == pytest.approx(1.75 * GIB)
    assert f"cgroup {root}/{cg}/memory.max = 2.00 GB, 1.75 GB of it free / 1 rank" in mem.source


def test_an_ancestors_tighter_limit_counts_and_ranks_on_the_node_share_it(tmp_path):
    root = machine(tmp_path, "0::/job/step\n")
    _write(root, "sys/fs/cgroup/job/step/memory.max", f"{8 * GIB}\n")
    _write(root, "sys/fs/cgroup/job/memory.max", f"{2 * GIB}\n")
    mem = cgroup_memory(4, root)
    assert mem.bytes_per_rank == pytest.approx(0.5 * GIB)
    assert "job/memory.max = 2.00 GB" in mem.source and "/ 4 ranks on this node" in mem.source


def test_cgroup_v1_limit_in_bytes_and_its_no_limit_value(tmp_path):
    root = machine(tmp_path, "5:cpu:/\n4:memory:/process_api/abc\n0::/\n")
    base = "sys/fs/cgroup/memory"
    _write(root, f"{base}/memory.limit_in_bytes", "9223372036854771712\n")  # v1's "no limit"
    _write(root, f"{base}/process_api/abc/memory.limit_in_bytes", f"{2 * GIB}\n")
    _write(root, f"{base}/process_api/abc/memory.usage_in_bytes", f"{GIB}\n")
    _write(root, f"{base}/process_api/abc/memory.stat", f"total_inactive_file {GIB // 2}\n")
    mem = host_memory(2, root, rlimit=-1)
    assert mem.bytes_per_rank == pytest.approx(0.75 * GIB)
    assert f"{base}/process_api/abc/memory.limit_in_bytes = 2.00 GB" in mem.source


def test_rlimit_as_is_per_process_less_its_address_space(tmp_path):
    root = machine(tmp_path)
    mem = rlimit_memory(root, limit=3 * GIB)
    assert mem.bytes_per_rank == pytest.approx(2 * GIB)  # VmSize 1 GiB
    assert "RLIMIT_AS (ulimit -v) = 3.00 GB" in mem.source
    assert host_memory(8, root, rlimit=3 * GIB).source == mem.source  # not divided by ranks
    assert rlimit_memory(root, limit=-1) is None


def test_under_a_2_gb_job_limit_megatron_train_refuses_naming_the_limit(tmp_path, monkeypatch):
    root = machine(tmp_path, "0::/job\n")
    _write(root, "sys/fs/cgroup/job/memory.max", f"{2 * GIB}\n")
    _write(root, "sys/fs/cgroup/job/memory.current", "0\n")
    monkeypatch.setenv("MEGATRON_FORCE_CPU", "1")
    monkeypatch.setattr(train, "host_memory", lambda ranks: host_memory(ranks, root, rlimit=-1))
    cfg = load_config(TINY, MIDDLE)
    assert fit.check(cfg, 1, host_memory(1, root, rlimit=-1)).status == fit.MISFIT
    assert fit.check(cfg, 1, fit.cpu_memory("MemAvailable: 23802675 kB", 1)).status == fit.FITS
    with pytest.raises(InputError) as e:
        train.check_memory(cfg, LaunchEnv(0, 1, 0, "localhost", 29500, "single"))
    assert f"cgroup {root}/sys/fs/cgroup/job/memory.max = 2.00 GB" in str(e.value)
    assert "predicted not to fit" in str(e.value)
