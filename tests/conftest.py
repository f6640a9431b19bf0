import json
import os
import resource
from pathlib import Path

import pytest

from tests.support.paths import ROOT

# One OpenMP thread for torch in this process and every process a test starts (they inherit it;
# torchrun keeps a value it finds): the suite runs four pytest processes, and up to 8 ranks, on 2
# cores, where a second thread per process only spins. Measured on the 2-core machine, loaded: a
# 4-step tiny.yaml run took 9.6 s of CPU with torch's default of 2 threads and 5.5 s with 1, its
# steps 0.2-3.3 s against 0.1 s. Set before any test imports torch; a value already set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")


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


SLOWEST = 10  # how many tests the closing summary names
_took: dict = {}
_cpu: dict = {}  # nodeid -> CPU seconds of this process and its finished children


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # waited-for descendants, recursively
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    begin = _cpu_seconds()
    yield
    _cpu[item.nodeid] = _cpu_seconds() - begin


def pytest_runtest_logreport(report):
    _took[report.nodeid] = _took.get(report.nodeid, 0.0) + report.duration


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    """The slowest tests with setup, call and teardown together (a module's shared fixture is
    paid in the setup of its first test), last before pytest's closing line, so a CI log ends
    saying where the suite's time went."""
    tr = terminalreporter
    _print_shared_launches(tr)
    if not _took:
        return
    tr.write_sep("=", f"slowest {min(SLOWEST, len(_took))} tests (setup + call + teardown; "
                      "wall and CPU seconds, CPU with the test's processes)")
    for nodeid, seconds in sorted(_took.items(), key=lambda kv: -kv[1])[:SLOWEST]:
        tr.write_line(f"{seconds:8.1f}s {_cpu.get(nodeid, 0.0):8.1f}s {nodeid}")
    tr.write_line(f"{sum(_took.values()):8.1f}s {sum(_cpu.values()):8.1f}s in all {len(_took)} tests")
    record = os.environ.get("MEGATRON_TEST_TIMES")
    if record:  # every test's wall and CPU seconds, for finding where the suite's time goes
        _merge_times(Path(record), {nodeid: [round(_took[nodeid], 2),
                                             round(_cpu.get(nodeid, 0.0), 2)] for nodeid in _took})


def _merge_times(path: Path, mine: dict) -> None:
    """make test's pytest processes end one by one and each adds its tests to the one file
    (under a lock, so none overwrites another's)."""
    import fcntl
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read()
        times = json.loads(text) if text.strip() else {}
        times.update(mine)
        f.seek(0)
        f.truncate()
        f.write(json.dumps(dict(sorted(times.items())), indent=0))


def _shared_launch_notes(config):
    """What tests/distributed/conftest.py noted of the shared launches in this session's base
    temp directory."""
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None:
        return []
    path = factory.getbasetemp() / "shared_launches_summary.json"
    return [json.loads(path.read_text())] if path.exists() else []


def _print_shared_launches(tr):
    """What the shared launches cost: one line per launch (ranks, jobs, seconds), a module
    that passed only on its second try in yellow, and the 10 slowest jobs."""
    for note in _shared_launch_notes(tr.config):
        for log in note["logs"]:
            retried = [line for line in log if "SECOND TRY" in line]
            costs = [line for line in log if line not in retried]
            if costs:
                tr.write_line("shared launches: " + "; ".join(costs))
            for line in retried:
                tr.write_line("shared launches: " + line, yellow=True, bold=True)
        for seconds in note["seconds"]:
            slowest = sorted(seconds.items(), key=lambda kv: -kv[1])[:10]
            if slowest:
                tr.write_line("shared launches, slowest jobs: " + "; ".join(
                    f"{name} {s:.0f} s" for name, s in slowest))
