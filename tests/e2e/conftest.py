import pytest

from tests.e2e.slurm_cluster import cluster


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A real Slurm with two fake nodes n1, n2 for the session (tests/e2e/slurm_cluster.py)."""
    with cluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running
