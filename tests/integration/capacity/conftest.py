"""Fixtures: the block index on the session's Valkey and a Cluster over it."""

import pytest

from chalicelib.index import BlockIndex

from .harness import Cluster


@pytest.fixture
def index(valkey, clock):
    return BlockIndex(valkey, "t", clock)


@pytest.fixture
def cluster(index, clock):
    return Cluster(index, clock)
