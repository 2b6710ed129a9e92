"""conftest.py: the `market` fixture (apps_util.Market), its gateways
stopped (and checked for sanitizer reports) at the end."""
import pytest

from apps_util import Market


@pytest.fixture
def market(new_daemon, tmp_path):
    m = Market(new_daemon, tmp_path)
    yield m
    m.close()
