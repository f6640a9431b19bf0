"""Joining the process group (megatron/launch/device.py) and a torchrun worker's tie to its agent
(megatron/launch/lifetime.py): device_id only where torch accepts it and does not hang with it,
the timeout from parallel.timeout_minutes, the preflight before the rendezvous, and when a
worker follows its launcher (the agent's death, with real processes, is
tests/integration/test_launch_agent_death.py)."""
import pytest
import torch

from megatron.config import ConfigError, load_config
from megatron.launch import device as device_mod
from megatron.launch.device import DeviceInfo, init_distributed, passes_device_id
from megatron.launch.env import LaunchEnv
from megatron.launch.lifetime import follow_launcher
from tests.support.paths import TINY


@pytest.mark.parametrize("version, accepts, world, expected", [
    ("2.1.2+rocm5.6", False, 8, False),   # torch < 2.3: no device_id parameter (TypeError)
    ("2.3.0", True, 8, True),
    ("2.5.1+rocm6.2", True, 8, True),
    ("2.6.0", True, 8, False),            # 2.6.x and 2.7.0 hang with it (pytorch#153960)
    ("2.6.0+rocm6.2.4", True, 8, False),
    ("2.7.0+cu126", True, 8, False),
    ("2.7.1", True, 8, True),
    ("2.10.0+rocm7.1", True, 8, True),
    ("2.8.0.dev20250501", True, 8, True),
    ("2.10.0", True, 1, False),           # a world of one has nobody to split groups with
])
def test_passes_device_id(version, accepts, world, expected):
    assert passes_device_id(version, accepts, world) is expected


def test_timeout_minutes_is_a_validated_config_key():
    assert load_config(TINY).parallel.timeout_minutes == 10
    assert load_config(TINY, ["parallel.timeout_minutes=45"]).parallel.timeout_minutes == 45
    for bad in ("0", "-5", "1.5", "soon"):
        with pytest.raises(ConfigError, match="parallel.timeout_minutes"):
            load_config(TINY, [f"parallel.timeout_minutes={bad}"])


@pytest.fixture
def captured(monkeypatch):
    """init_distributed with torch's init_process_group replaced by a recorder that, like
    torch >= 2.3, accepts device_id."""
    calls = []

    def recorder(backend, rank=None, world_size=None, timeout=None, store=None, device_id=None):
        kw = dict(rank=rank, world_size=world_size, timeout=timeout, store=store,
                  device_id=device_id)
        calls.append((backend, {k: v for k, v in kw.items() if v is not None}))

    monkeypatch.setattr(device_mod.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(device_mod.dist, "init_process_group", recorder)
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NCCL_NET",
                "NCCL_NET_PLUGIN", "MEGATRON_NET_PREFLIGHT"):
        monkeypatch.delenv(key, raising=False)
    return calls


GPU = DeviceInfo(torch.device("cuda", 0), "rocm", "AMD Instinct MI250X", "gfx90a", 191.5)
CPU = DeviceInfo(torch.device("cpu"), "cpu", "cpu", None, None)
TWO = LaunchEnv(1, 16, 1, "127.0.0.1", 29500, "slurm", 2)


def test_timeout_and_device_id_reach_init_process_group(captured):
    init_distributed(TWO, GPU, timeout_s=45 * 60)
    backend, kw = captured[0]
    assert backend == "nccl" and kw["timeout"].total_seconds() == 2700
    accepts = passes_device_id(torch.__version__, True, 16)
    assert ("device_id" in kw) is accepts and kw.get("device_id", GPU.device) == GPU.device


def test_torch_without_device_id_is_not_given_one(captured, monkeypatch):
    # torch 2.1/2.2 (pyproject allows >= 2.1) raise TypeError on an unknown device_id.
    def old_torch(backend, rank=None, world_size=None, timeout=None, store=None):
        captured.append((backend, dict(rank=rank, timeout=timeout)))

    monkeypatch.setattr(device_mod.dist, "init_process_group", old_torch)
    init_distributed(TWO, GPU)
    assert captured[0][0] == "nccl"


def test_cpu_never_passes_device_id(captured):
    init_distributed(TWO, CPU)
    backend, kw = captured[0]
    assert backend == "gloo" and "device_id" not in kw
    assert kw["timeout"].total_seconds() == 600


def test_preflight_runs_before_the_rendezvous(captured, monkeypatch, tmp_path):
    from megatron.config.errors import InputError
    monkeypatch.setenv("NCCL_NET", "OFI")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    with pytest.raises(InputError, match="network preflight"):
        init_distributed(TWO, GPU)
    assert captured == []  # nobody was left waiting in a rendezvous


def test_follow_launcher_only_under_torchrun():
    torchrun = LaunchEnv(0, 2, 0, "127.0.0.1", 29500, "torchrun")
    assert not follow_launcher(torchrun, {"RANK": "0"})  # RANK without torchrun's agent
    assert not follow_launcher(TWO, {"TORCHELASTIC_RUN_ID": "x"})
