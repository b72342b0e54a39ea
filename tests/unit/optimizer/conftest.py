"""Fixtures of the optimizer tests: the shared real traces, loaded once per session."""
from __future__ import annotations

from pathlib import Path

import pytest

from chalicelib.optimizer.traces import read_trace

REPO_ROOT = Path(__file__).resolve().parents[3]
TRACES = (REPO_ROOT.parent / "shared" / "traces").resolve()
CONVERSATION = TRACES / "mooncake_conversation.jsonl"
EVENT_LOG = TRACES / "kvcm_event_publisher.log"


@pytest.fixture(scope="session")
def conversation():
    """Every record of the Mooncake conversation trace."""
    return list(read_trace(CONVERSATION, "mooncake"))


@pytest.fixture(scope="session")
def event_log():
    """Every record of the KVCM event-log sample."""
    return list(read_trace(EVENT_LOG, "kvcm_events"))
