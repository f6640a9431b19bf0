import pytest

from tests.support.paths import ROOT


@pytest.fixture
def root():
    return ROOT
