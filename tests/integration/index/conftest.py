"""The block index on the session's Valkey and one instance's layout on it."""
import pytest

from chalicelib.index import BlockIndex


@pytest.fixture
def index(valkey, clock):
    return BlockIndex(valkey, "t", clock)


@pytest.fixture
def layout(index):
    return index.layout("inst", 4)
