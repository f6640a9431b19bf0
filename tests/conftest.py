import pytest

from tests.support.paths import ROOT
# Not used here: tests/unit/test_planner_measured_peak.py still imports torchrun from this module.
from tests.support.procs import torchrun  # noqa: F401


@pytest.fixture
def root():
    return ROOT
