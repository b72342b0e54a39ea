"""Fixtures: a Cluster over the block index (``index``, in tests/integration/conftest.py)."""

import pytest

from .harness import Cluster


@pytest.fixture
def cluster(index, clock):
    return Cluster(index, clock)
