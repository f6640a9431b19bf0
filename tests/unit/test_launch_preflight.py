"""The network preflight (megatron/launch/preflight.py): when it runs, and what it says when the
plugin or libfabric cannot be loaded. Loading real libraries in fresh processes is
tests/integration/test_launch_preflight_libs.py."""
import pytest

from megatron.config.errors import InputError
from megatron.launch.env import LaunchEnv
from megatron.launch.preflight import check_network


def launch(world=16, nodes=2, rank=0):
    return LaunchEnv(rank, world, 0, "n1", 29500, "slurm", nodes)


@pytest.mark.parametrize("vendor, world, nodes, env, slingshot", [
    ("cpu", 16, 2, {"NCCL_NET": "OFI"}, True),            # gloo: no RCCL at all
    ("rocm", 1, 1, {"NCCL_NET": "OFI"}, True),            # a world of one talks to nobody
    ("rocm", 16, 2, {"NCCL_NET": "Socket"}, True),        # sockets chosen on purpose
    ("rocm", 16, 2, {"NCCL_NET": "IB"}, False),           # InfiniBand cluster, built-in transport
    ("rocm", 16, 2, {}, False),                           # no Slingshot, nothing asked for
    ("rocm", 8, 1, {}, True),                             # one node: no network traffic
    ("rocm", 16, 2, {"MEGATRON_NET_PREFLIGHT": "off", "NCCL_NET": "OFI"}, True),
])
def test_not_required(vendor, world, nodes, env, slingshot):
    result = check_network(launch(world, nodes), vendor, env, slingshot=slingshot)
    assert not result.ran


@pytest.mark.parametrize("env, slingshot, needle", [
    ({"NCCL_NET": "OFI"}, False, "NCCL_NET=OFI asks for the libfabric network plugin"),
    ({"NCCL_NET": "AWS Libfabric"}, False, "NCCL_NET=AWS Libfabric asks"),
    ({"NCCL_NET_PLUGIN": "/nowhere/librccl-net.so"}, False, "NCCL_NET_PLUGIN=/nowhere"),
    ({}, True, "spans 2 nodes with Slingshot NICs"),
])
def test_required_and_missing_is_one_message(env, slingshot, needle, tmp_path):
    env = dict(env, LD_LIBRARY_PATH=str(tmp_path))
    with pytest.raises(InputError) as e:
        check_network(launch(), "rocm", env, slingshot=slingshot)
    message = str(e.value)
    assert message.startswith("network preflight: ") and needle in message
    assert "NCCL_NET=Socket" in message  # the deliberate way out is named
    assert "\n" not in message


def test_plugin_none_contradicts_ofi():
    with pytest.raises(InputError, match="NCCL_NET_PLUGIN=none disables"):
        check_network(launch(), "rocm", {"NCCL_NET": "OFI", "NCCL_NET_PLUGIN": "none"},
                      slingshot=False)


def test_bad_mode_names_the_variable():
    with pytest.raises(InputError, match="MEGATRON_NET_PREFLIGHT='sometimes'"):
        check_network(launch(), "rocm", {"MEGATRON_NET_PREFLIGHT": "sometimes"})


def test_always_checks_without_a_gpu(tmp_path):
    env = {"MEGATRON_NET_PREFLIGHT": "always", "NCCL_NET": "OFI", "LD_LIBRARY_PATH": str(tmp_path)}
    with pytest.raises(InputError, match="cannot be loaded"):
        check_network(launch(), "cpu", env, slingshot=False)
