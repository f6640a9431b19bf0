import pytest

from tests.support.launch_batches import Batches

_logs: list = []
_seconds_of: list = []


@pytest.fixture(scope="session")
def shared_launches(request, tmp_path_factory):
    """One launch per world size for every module of this session that defines `launches(tmp)`
    (tests/support/launch_batches.py); a module's fixture reads its results with
    `shared_launches.results(__name__)`. Only the modules with a selected test
    that reads them take part."""
    modules = {}
    for item in request.session.items:
        launches = getattr(item.module, "launches", None)
        if callable(launches) and "shared_launches" in getattr(item, "fixturenames", ()):
            modules[item.module.__name__] = launches
    batches = Batches(str(tmp_path_factory.mktemp("shared_launches")), modules)
    _logs.append(batches.log)
    _seconds_of.append(batches.job_seconds)
    return batches


def pytest_terminal_summary(terminalreporter):
    """What the shared launches cost: one line per launch (ranks, jobs, seconds)."""
    for log in _logs:
        retried = [line for line in log if "SECOND TRY" in line]
        costs = [line for line in log if line not in retried]
        if costs:
            terminalreporter.write_line("shared launches: " + "; ".join(costs))
        for line in retried:
            terminalreporter.write_line("shared launches: " + line, yellow=True, bold=True)
    for seconds in _seconds_of:
        slowest = sorted(seconds.items(), key=lambda kv: -kv[1])[:10]
        if slowest:
            terminalreporter.write_line("shared launches, slowest jobs: " + "; ".join(
                f"{name} {s:.0f} s" for name, s in slowest))
