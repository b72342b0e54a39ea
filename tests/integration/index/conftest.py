"""One instance's layout on the block index (``index``, in tests/integration/conftest.py);
cluster-mode Valkeys (one node holding every slot, or three masters) for the cluster client."""

import pytest

from tests.helpers import valkey_cluster


@pytest.fixture
def layout(index):
    return index.layout("inst", 4)


@pytest.fixture(scope="module")
def three_masters(tmp_path_factory):
    """A cluster of three masters for a test module."""
    with valkey_cluster(tmp_path_factory.mktemp("cluster3"), 3) as client:
        yield client


@pytest.fixture
def cluster3(three_masters):
    """The three-master cluster, flushed."""
    for node in three_masters.get_primaries():
        three_masters.get_redis_connection(node).flushall()
    return three_masters
