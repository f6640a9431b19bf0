import pytest

from tests.support.paths import ROOT


@pytest.fixture
def root():
    return ROOT


@pytest.fixture
def one_rank_group():
    """A world of one for the test, closed after it: a group left open would change what later
    tests in this process see (dist.is_initialized())."""
    import torch.distributed as dist
    opened = not dist.is_initialized()
    if opened:
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    if opened:
        dist.destroy_process_group()
