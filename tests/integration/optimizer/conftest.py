"""Fixtures of the optimizer tests: the shared real traces, loaded once per session."""

from __future__ import annotations

import pytest

from chalicelib.optimizer.traces import read_trace
from tests.helpers import CONVERSATION, EVENT_LOG


@pytest.fixture(scope="session")
def conversation():
    """Every record of the Mooncake conversation trace."""
    return list(read_trace(CONVERSATION, "mooncake"))


@pytest.fixture(scope="session")
def event_log():
    """Every record of the KVCM event-log sample."""
    return list(read_trace(EVENT_LOG, "kvcm_events"))
