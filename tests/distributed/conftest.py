import json
import os

import pytest

from tests.support.launch_batches import Batches

# what the shared launches cost, for the closing summary (tests/conftest.py), which reads it from
# this file in the session's base temp directory
NOTE = "shared_launches_summary.json"
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


def pytest_sessionfinish(session):
    if _logs:
        base = session.config._tmp_path_factory.getbasetemp()
        with open(os.path.join(base, NOTE), "w") as f:
            json.dump({"logs": _logs, "seconds": _seconds_of}, f)
