"""Launches whose port is picked in advance (tests/support/procs.free_port) and taken by another
process before the server binds it: the start is retried on a fresh port instead of failing the
test (a fresh-clone CI run once failed so, EADDRINUSE at torchrun's rendezvous). Where the server
can bind port 0 itself the tests use that instead (torchrun --standalone, file:// stores)."""
import itertools
import socket

import pytest
import torch.distributed as dist

from tests.e2e import slurm_cluster
from tests.support.procs import port_taken


@pytest.fixture
def held_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s.getsockname()[1]


def test_the_clash_message_of_a_rendezvous_store_is_recognised(held_port):
    with pytest.raises(Exception) as err:
        dist.TCPStore("127.0.0.1", held_port, 2, True, wait_for_workers=False)
    assert port_taken(str(err.value)), str(err.value)
    assert not port_taken("RuntimeError: Connection reset by peer")


@pytest.mark.slow  # two Slurm starts, the first failing: about 20 s
def test_a_slurm_daemon_port_taken_before_it_binds_is_retried_on_a_fresh_one(
        tmp_path, held_port, monkeypatch):
    picks, real = itertools.count(), slurm_cluster.free_port
    monkeypatch.setattr(slurm_cluster, "free_port",
                        lambda: held_port if next(picks) == 0 else real())
    with slurm_cluster.cluster(tmp_path) as running:
        conf = open(running["conf"]).read()
    assert next(picks) == 2 * 3  # two starts of three ports each
    assert f"SlurmctldPort={held_port}" not in conf
