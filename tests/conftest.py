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


def _registries():
    """Every registry a test may extend (model variants, schedules, fused ops, schedule
    runners), as plain copies."""
    from megatron.config import variants
    from megatron.config.schedules import registry as schedules
    from megatron.engine import runners
    from megatron.kernels import registry as kernels
    return {"variants": {k: dict(v) for k, v in variants._REGISTRY.items()},
            "schedules": dict(schedules._RECORDS), "fused ops": dict(kernels._RECORDS),
            "runners": dict(runners.RUNNERS)}


@pytest.fixture(autouse=True, scope="module")
def registries_left_as_found(request):
    """A test module that registers a variant, schedule, fused op or runner must remove it: a
    registration left behind changes what later modules see (the generated docs/config.md lists
    the registered names; CI once failed on a toy norm another module had left)."""
    before = _registries()
    yield
    after = _registries()
    if after != before:
        changed = [name for name in before if before[name] != after[name]]
        pytest.fail(f"{request.module.__name__} left the registries changed ({', '.join(changed)}):"
                    " register in a fixture that unregisters", pytrace=False)
